"""Whether the installed CUDA software runs natively on this machine's GPUs: ``compat`` holds
CUDA's binary compatibility rules, ``lint`` judges each library with GPU code for each GPU,
``advice`` says what to install instead, ``dtypes`` judges the probe's dtypes against the
order the dtype table expects, ``watch`` keeps the daemon's scan (docs/native.md)."""
