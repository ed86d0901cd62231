"""Reporting: estimates, plans, catalogs and explanations as text, plots and procurement documents."""
