"""kernelsight.predictor: hardware catalog, kernel cost model, roofline, η inference.

The dependency-light core a laptop loads: never imports torch.
"""
