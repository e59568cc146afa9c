# The lorabench plugin itself is registered through the pytest11 entry point of the
# installed package; pytester is for the plugin's own tests in tests/.
pytest_plugins = ["pytester"]
