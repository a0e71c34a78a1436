# The C core is built by cffi at install time; everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["csrc/build_ffi.py:ffibuilder"])
