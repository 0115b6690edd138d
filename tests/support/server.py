"""The model name the test server (the `serving` fixture in tests/conftest.py) serves the session engine under."""

MODEL_NAME = "smollm2"
