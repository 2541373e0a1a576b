"""See npu_device/__init__.py."""
