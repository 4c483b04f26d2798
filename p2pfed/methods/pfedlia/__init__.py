"""pFedLIA (Rokvic et al. 2025): lazy influence of peers' partial models, then personalised FedAvg with the
peers that help. ``p2p``: every node scores its peers and picks its own with a local 2-means split; ``central``:
a coordinator clusters the influence matrix with OPTICS. Both score with influence/lazy_influence.py and take
their options from their own tables, ``[methods.pfedlia-p2p]`` and ``[methods.pfedlia-central]`` (options.py).
``pfedlia-p2p-paper`` and ``pfedlia-central-paper`` are the same methods with the paper's own selection and
clustering rules by default, to run beside ours."""
