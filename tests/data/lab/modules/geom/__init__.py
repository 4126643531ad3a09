from .shapes import Point
from . import shapes
