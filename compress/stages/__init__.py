"""Stage kinds. Each module defines one thin adapter; the algorithms live elsewhere."""
