"""Every variant module of the replay, imported once so that each registers what it runs (its blocks and
token mixers in :mod:`.registry`, its kernels in :mod:`.attention_kernels`): the one place that names them.
A new layer kind's replay is one module registering its mixer, plus a line here."""

from gpumem_gui.core.replay import (  # noqa: F401  imported for their registrations
    altup,
    attention,
    cohere,
    cross_attention,
    dsa,
    dsv4,
    falcon_h1,
    gemma4,
    gptj,
    kda,
    legacy,
    lightning,
    linear_attention,
    mamba1,
    mamba2,
    short_conv,
    sinks,
)
