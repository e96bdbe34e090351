"""``gpumem diagnose``: what a GPU said (:mod:`gpumem_gui.core.observed`), explained against the estimate of
the run and its fit on the observed GPU (:mod:`gpumem_gui.core.fit`); above both in the core's layers."""
