"""The model: what ``stacks.yaml`` declares and whether it can work.

Reading YAML with positions (``yamlsrc``), the JSON Schemas (``schema``), the loaded stacks
(``loader`` into ``entities``), the instance table (``instances``), the compatibility rules
(``rules``), CUDA architectures (``cuda_arch``) and the pins from PyPI (``pin``). It imports
neither the image nor the deploy room.
"""
