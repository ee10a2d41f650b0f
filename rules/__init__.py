"""Diagnosis rules (installed as ``analyzer.rules``): one module per rule, found by
``analyzer.rules.engine.all_rules`` (every module of this package that is not a helper). See
``analyzer.rules.engine`` for the rule contract; adding a rule is adding a file."""
