"""The planner and everything it computes with, without torch.

Introduced in "Choosing a pipeline". For a model, a cluster and a global batch it enumerates
layouts (tensor, pipeline and data parallel sizes, sharding, schedule, microbatches,
recomputation), predicts each one's memory per GPU in bytes and its step time, and ranks them.
Nothing here imports torch, nor anything of ``ppbook`` outside this subpackage; chapters and
scripts import these modules from here (:class:`ppbook.timeline.Event` re-exports
:class:`~ppbook.planner.events.Event`), and no module of ``ppbook`` outside it shares one of their
names. The same code answers ``python -m ppbook.plan``, the chapters, and (ported to
JavaScript, and tested equal) the planner page of the site.

- :mod:`~ppbook.planner.schedules`: torch's seven schedules as pure functions (stage placement,
  constraints, and the order of actions each rank runs, equal to torch's own);
- :mod:`~ppbook.planner.dataflow`: which action of a step waits on which;
- :mod:`~ppbook.planner.events`: a timed action, the timeline format of simulated and recorded steps;
- :mod:`~ppbook.planner.simulate`: the dependency-driven simulator of a step;
- :mod:`~ppbook.planner.shapes`: model shapes, presets and Hugging Face configs, parameter counts;
- :mod:`~ppbook.planner.hardware`: GPUs and links;
- :mod:`~ppbook.planner.memory`: bytes per GPU (state by sharding mode, activations, logits, buffers);
- :mod:`~ppbook.planner.traffic`: bytes each kind of parallelism moves;
- :mod:`~ppbook.planner.fsdp_window`: FSDP2's all-gathers in a step, with torch's unshard window;
- :mod:`~ppbook.planner.costs`: seconds per action, measured or estimated;
- :mod:`~ppbook.planner.search`: the candidates, their predictions, the ranking;
- :mod:`~ppbook.planner.export`: what torchtitan and Megatron-LM run, for the exports.
"""
