"""The command line: the ``deepspec`` console script (``commands.dispatch``, one verb per pipeline stage),
``train.py``'s entry (``commands.train_entry``) and the verbs that have no package of their own (train, data,
recipes, env). Nothing in the package imports this one: it sits on top and calls down into ``jobs`` and the
verbs' packages."""
