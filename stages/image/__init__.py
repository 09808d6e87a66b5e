"""Images: the declared deploy preprocessing (OpenCV), PIL-exact resampling, training references (PaddleOCR's own
classifier preprocessing among them), the usual causes of a mismatch, the parity diagnosis and its picture."""
