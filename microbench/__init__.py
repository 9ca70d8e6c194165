"""kernelsight.microbench"""
