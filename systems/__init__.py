"""Offloading policies. One file per system; each answers the engine's questions over expert ids.

Systems never import torch: they see expert keys (ints), routing ids and times in ms.
"""
