"""Images: the declared deploy preprocessing (OpenCV), PIL-exact resampling, training references, the parity
diagnosis and its picture."""
