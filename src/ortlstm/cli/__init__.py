"""The command line's parts, one module per group of sub-commands; ``ortlstm.__main__`` assembles them.

``common`` (torch's vocabulary, old spellings, the Trainer's options), ``demos`` (``demo``,
``demo-chars``, ``demo-ocr``), ``models`` (``convert``, ``train-step``, ``export``, ``artifacts``)
and ``fit``. Each module gives, per sub-command, ``add_<command>(commands)`` (its parser) and
``<command>_command(args)`` (what it runs, returning the exit status).
"""
