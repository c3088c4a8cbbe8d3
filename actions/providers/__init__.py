"""The receivers' clients: the payment provider's contract (``base``), money conversion
(``money``), Stripe (``stripe_adapter``), the accounting system (``accounting``) and mail (``mail``).

The package re-exports nothing: each name is imported from its own module, so that the sandbox,
which needs only the standard library and ``base``, does not pull in the stripe package.
"""
