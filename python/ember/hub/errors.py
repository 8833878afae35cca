"""The one error of ember.hub: a model that could not be found or fetched."""


class ModelNotFound(Exception):
    """A model could not be found locally or fetched; the message says what to do."""
