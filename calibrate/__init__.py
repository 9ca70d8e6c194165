"""kernelsight.calibrate"""
