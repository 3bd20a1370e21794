"""What the tests share: models, crafted files, processes, probes. No test lives here; nothing here imports a test.

Each test imports what it needs from here by name (``from support.models import ConvBnRelu``); ``tests/`` is on
the import path of the tests and of every process they start, so a child imports a probe as ``support.X`` too.

=================  ==================================================================================
module             what it holds
=================  ==================================================================================
``models``         the models the suite compiles (the seed, scalar cases, planted precision spots, garbage)
``graphs``         partitioned graphs built by hand, and the check that an inlined graph is the same
``programs``       saved programs: the seed scenario, save and load in memory, engine calls and labels
``scalars``        scalars on engine boundaries, a scalar case compiled
``values``         outputs compared: as a list, largest difference, every dtype, bit-for-bit
``processes``      processes of the tests' own: new interpreters, forked children, fresh loads
``forking``        the loop of the tests' forking interpreter and what each child does
``commands``       the command line as tests run it; an unusable input's exit
``engine_files``   files with TensorRT engines as each release writes them
``verdicts``       crafted programs and models the verdict tests share
``hostile``        files crafted against the reader and the verifier
``pairs``          the supported (release, torch) pairs, release shells, the skips each pair may report
``plugin_runs``    a release's shell package and user processes run with it
``tensor_parallel`` the torchrun worker of the rank-set tests
``memory_steps``   one step of the memory tests in a process of its own
``breach_probe``, ``cuda_probe``, ``report_probe``  jobs run in a sandboxed child (registered with
                   ``trt_inline.isolation.job``): what code inside could reach, what CUDA needs, a report at
                   the parent's caps
=================  ==================================================================================
"""
