"""From a valid stack to tested images: plan the layers (``plan``), render their Dockerfiles
(``render``, ``generated``), make the base (``bootstrap``), build on a Docker engine (``engine``,
``ca``, ``build``) and test each layer (``testing``, ``testrecord``). Imports the model only.
"""
