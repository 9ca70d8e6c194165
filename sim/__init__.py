"""kernelsight.sim"""
