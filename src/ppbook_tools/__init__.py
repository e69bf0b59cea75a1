"""The book's build and test plumbing, beside the teaching package :mod:`ppbook`.

Readers import :mod:`ppbook`; nothing here is taught or needed to run a chapter or a script:

* :mod:`ppbook_tools.zygote` -- the launch server of the build and the tests: it imports torch
  once and forks each launch's ranks from it; it plugs itself into ``ppbook.launch``
  (``use_forker``) in the processes it serves, and ``ppbook`` never imports it;
* :mod:`ppbook_tools.kernel` -- a page's Jupyter kernel forked from a second such server (torch and
  matplotlib imported once for every page), which ``tools/build_book.py`` starts in place of
  ``ipykernel_launcher``.

The other plumbing (the page executor, the notebook and PDF makers, the benchmarks) are scripts
in ``tools/``; this package holds what processes started by the build must import.
"""
