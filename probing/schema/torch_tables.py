"""The tables of a torch job: tracing (python.torch_trace), NaN checks, the live model, tensors
and optimizers, CUDA memory, and torch.distributed's collectives and process groups. Part of
the contract of schema/tables.py, which lists every table. Standard library only, Python 3.8.
"""

from __future__ import annotations

from .definition import Column, Table

TORCH_TRACE = Table(
    "python.torch_trace",
    "One row per traced module call (forward, and backward with `trace on --backward`) and per "
    "optimizer step, recorded while `probing PID trace on` (or PROBING_TORCH_TRACE=1) is in effect. "
    "A ring buffer: the newest rows, up to `trace on --capacity` (1 M by default).",
    [
        Column("step", "BIGINT", "optimizer step the call belongs to, counted from 0 when tracing began"),
        Column("seq", "BIGINT", "order of the call's start within its step (micro-batches keep counting)"),
        Column(
            "module", "VARCHAR", "qualified module name, e.g. model.layers.0.attn; the optimizer's for steps"
        ),
        Column("module_type", "VARCHAR", "class name of the module or optimizer"),
        Column("stage", "VARCHAR", "'forward', 'backward' or 'optimizer'"),
        Column("duration", "DOUBLE", "seconds; CPU time between the hooks, or CUDA event time on a GPU"),
        Column("time_offset", "DOUBLE", "seconds from the start of the step to the start of the call"),
        Column(
            "allocated",
            "DOUBLE",
            "MB allocated by torch on the module's CUDA device after the call; NULL on CPU",
        ),
        Column("max_allocated", "DOUBLE", "MB, peak of allocated so far; NULL on CPU"),
        Column("reserved", "DOUBLE", "MB held by the CUDA caching allocator; NULL on CPU"),
        Column("rank", "BIGINT", "torch.distributed rank (RANK, or 0 when not distributed)"),
        Column("ts", "TIMESTAMP", "when the call started (UTC)"),
        Column(
            "session",
            "BIGINT",
            "tracing session: 1 from the first `trace on`, one more at each `trace on` after a `trace off`; "
            "negative (-N) for the rows of the step under way when session N began (a part of a step: "
            "step times and the module flame graph leave such steps out)",
        ),
    ],
)

NAN_EVENTS = Table(
    "python.nan_events",
    "The first module of each step whose output (forward) or input gradient (backward) held NaN "
    "or Inf, recorded while `probing PID nan on` (or PROBING_NAN=1) is in effect.",
    [
        Column("step", "BIGINT", "optimizer step, as in python.torch_trace"),
        Column("seq", "BIGINT", "order of the offending call within its step"),
        Column("module", "VARCHAR", "qualified module name"),
        Column("module_type", "VARCHAR", "class name of the module"),
        Column("stage", "VARCHAR", "'forward' (its output) or 'backward' (the gradients it produced)"),
        Column(
            "tensor",
            "VARCHAR",
            "which tensor, its dtype, shape and device, e.g. output[0] float32[32, 10] on cpu",
        ),
        Column(
            "nan_count",
            "BIGINT",
            "NaN values in that tensor where counted: the check keeps one value a tensor on its device, "
            "so NULL where it held a NaN, 0 where it held Infs and no NaN",
        ),
        Column("inf_count", "BIGINT", "Inf values in that tensor where counted: NULL, as above"),
        Column(
            "input_finite",
            "BOOLEAN",
            "whether what came in (inputs, or the output gradient) was finite: true means the NaN/Inf "
            "arose in this module, from its computation or from its weights (weights_finite says which)",
        ),
        Column(
            "weights_finite",
            "BOOLEAN",
            "whether this module's own parameters and buffers (and those of its children that are not "
            "hooked) were finite in the step it was seen (read when the step ended, before the "
            "update): false means its weights held NaN/Inf (an update or a "
            "load wrote them before); NULL when not checked (its input was not finite, or the check, "
            "cut short at 10 ms, found none by then)",
        ),
        Column(
            "weights_already_nonfinite",
            "BOOLEAN",
            "whether those non-finite weights were already so when these NaN checks began (the cause "
            "is earlier than the checks): true when one of them was not written since (torch's version "
            "counter) or the check of every weight at the start read it so; false when that check read "
            "them finite, or they are finite; NULL when not known",
        ),
        Column("rank", "BIGINT", "torch.distributed rank"),
        Column("ts", "TIMESTAMP", "when it was seen (UTC)"),
    ],
)

MODULES = Table(
    "python.modules",
    "Every module of the job's top-level models (found in __main__, in its threads' frames, or by "
    "gc), read at the time of the query; gradient norms are taken in the training thread at its next "
    "optimizer step (`query --step-wait`), or while the job is quiet, and are NULL with a note otherwise.",
    [
        Column("name", "VARCHAR", "qualified name: the model's variable name, then the submodule path"),
        Column("root", "VARCHAR", "name of the top-level module it belongs to"),
        Column("type", "VARCHAR", "class name"),
        Column("depth", "BIGINT", "0 for a top-level module, 1 for its children, ..."),
        Column("params", "BIGINT", "parameters (elements) of the module and its submodules"),
        Column("trainable_params", "BIGINT", "of those, the ones with requires_grad"),
        Column("device", "VARCHAR", "device of its first parameter; NULL without parameters"),
        Column("dtype", "VARCHAR", "dtype of its first parameter"),
        Column("training", "BOOLEAN", "module.training"),
        Column(
            "grad_norm", "DOUBLE", "L2 norm of the gradients of its own parameters; NULL when none has one"
        ),
        Column("has_nonfinite_grad", "BOOLEAN", "whether those gradients hold NaN or Inf"),
        Column(
            "traced",
            "BOOLEAN",
            "whether `trace on` or `nan on` watches its calls (hooked for the steps watched)",
        ),
    ],
)

TENSORS = Table(
    "python.tensors",
    "Live tensors: the models' parameters, gradients and buffers by name, then every other tensor "
    "gc finds, until a time budget (1 s) runs out; the query then says it was cut short. Gradients and "
    "grad_fn are read in the training thread at its next optimizer step, or while the job is quiet. "
    "A tensor with no name is given what holds it (held_by), found by a walk with a budget as long.",
    [
        Column(
            "name", "VARCHAR", "qualified parameter or buffer name (.grad for a gradient); NULL for others"
        ),
        Column("kind", "VARCHAR", "'parameter', 'gradient', 'buffer' or 'tensor'"),
        Column("shape", "VARCHAR", "e.g. [32, 256]"),
        Column("dtype", "VARCHAR", "e.g. float32"),
        Column("device", "VARCHAR", "e.g. cpu, cuda:0"),
        Column("bytes", "BIGINT", "elements times element size (views count the part they see)"),
        Column("requires_grad", "BOOLEAN", "tensor.requires_grad"),
        Column("is_param", "BOOLEAN", "whether it is an nn.Parameter"),
        Column("grad_fn", "VARCHAR", "autograd node that made it, e.g. AddmmBackward0; NULL for leaves"),
        Column(
            "held_by",
            "VARCHAR",
            "for a tensor with no name: a path from the job's variables to it, e.g. __main__.history[17] "
            "(a time-bounded walk from __main__, the job's frames and modules; matched to the row by shape, "
            "dtype, device and size); NULL where the walk did not reach it",
        ),
    ],
)

OPTIMIZERS = Table(
    "python.optimizers",
    "One row per parameter group of every optimizer in the job; values held in tensors (a tensor lr, "
    "the step count) are read in the training thread at its next optimizer step, or while the job is quiet.",
    [
        Column("optimizer", "VARCHAR", "the variable that holds it, e.g. optimizer (or its class name)"),
        Column("type", "VARCHAR", "class name, e.g. AdamW"),
        Column("param_group", "BIGINT", "index of the parameter group"),
        Column("lr", "DOUBLE", "learning rate now (after any scheduler)"),
        Column("momentum", "DOUBLE", "momentum; NULL for optimizers without one"),
        Column("beta1", "DOUBLE", "betas[0] (Adam family); NULL otherwise"),
        Column("beta2", "DOUBLE", "betas[1]"),
        Column("weight_decay", "DOUBLE", "weight decay"),
        Column("params", "BIGINT", "parameters (tensors) in the group"),
        Column("numel", "BIGINT", "elements in those parameters"),
        Column("steps", "BIGINT", "steps taken, from the optimizer's state; NULL when it keeps no count"),
    ],
)

CUDA_MEMORY = Table(
    "torch.cuda_memory",
    "torch.cuda.memory_stats() of every CUDA device, one row per counter; empty until the job has "
    "initialised CUDA (probing never initialises it).",
    [
        Column("device", "BIGINT", "CUDA device index"),
        Column(
            "stat",
            "VARCHAR",
            "counter name, e.g. allocated_bytes.all.current, reserved_bytes.all.peak, num_ooms",
        ),
        Column("value", "BIGINT", "its value (bytes for *_bytes counters)"),
    ],
)

COLLECTIVES = Table(
    "python.collectives",
    "This rank's collectives in flight and recently done (at most 10000, the newest), from the job's PyTorch "
    "Flight Recorder (a ring of 2000 by default; a query copies it, holding the GIL for tens of ms), or, "
    "where it is off, probing's record since the first query. Empty, with a note, without torch.distributed.",
    [
        Column("rank", "BIGINT", "this process's global rank (dist.get_rank())"),
        Column("pg_id", "VARCHAR", "process group name, e.g. 0 for the default group"),
        Column("pg_desc", "VARCHAR", "process group description, e.g. default_pg"),
        Column("pg_ranks", "VARCHAR", "JSON list of the group's global ranks, e.g. [0, 1, 2, 3]"),
        Column("seq", "BIGINT", "the group's sequence number: FR's collective_seq_id, or the group's count"),
        Column("p2p_seq", "BIGINT", "FR's p2p_seq_id; NULL with source 'probing'"),
        Column("is_p2p", "BOOLEAN", "whether it is a point-to-point operation (send/recv)"),
        Column("op", "VARCHAR", "e.g. all_reduce, broadcast, barrier"),
        Column("backend", "VARCHAR", "e.g. gloo, nccl"),
        Column("profiling_name", "VARCHAR", "e.g. gloo:all_reduce"),
        Column("input_sizes", "JSON", "shape of each input tensor, e.g. [[16]]"),
        Column("input_dtypes", "JSON", "dtype of each input tensor, in torch's C++ names, e.g. [Float]"),
        Column("output_sizes", "JSON", "shape of each output tensor"),
        Column("output_dtypes", "JSON", "dtype of each output tensor"),
        Column("state", "VARCHAR", "'scheduled', 'started' (not gloo), 'completed'; 'failed': it raised"),
        Column("time_created", "DOUBLE", "when it was enqueued, seconds since the epoch"),
        Column("time_started", "DOUBLE", "when it was seen started (NCCL), or the call began (probing)"),
        Column("time_completed", "DOUBLE", "when it was seen completed; NULL when unknown (gloo)"),
        Column("waited", "DOUBLE", "seconds from time_created to time_completed, or to the query"),
        Column("timeout_s", "DOUBLE", "the collective's timeout, seconds"),
        Column("record_id", "BIGINT", "the recorder's own id of the entry"),
        Column("thread_name", "VARCHAR", "thread that issued it"),
        Column("source", "VARCHAR", "'flight_recorder', or 'probing' (Python calls only: not DDP's buckets)"),
    ],
)

PROCESS_GROUPS = Table(
    "python.process_groups",
    "One row per process group this rank knows (torch.distributed's registry), with its progress: the "
    "Flight Recorder's pg_status, or probing's record where that is off. Empty without torch.distributed.",
    [
        Column("rank", "BIGINT", "this process's global rank"),
        Column("pg_id", "VARCHAR", "process group name, as pg_id in python.collectives"),
        Column("pg_desc", "VARCHAR", "process group description, e.g. default_pg"),
        Column("pg_ranks", "VARCHAR", "JSON list of the group's global ranks"),
        Column("size", "BIGINT", "ranks in the group"),
        Column("backend", "VARCHAR", "e.g. gloo, nccl"),
        Column("last_enqueued", "BIGINT", "sequence number of the last collective enqueued"),
        Column("last_started", "BIGINT", "of the last one seen started (NCCL only)"),
        Column(
            "last_completed",
            "BIGINT",
            "of the last one completed (torch's count, or its highest completed entry where that count lags)",
        ),
        Column("source", "VARCHAR", "'flight_recorder' or 'probing'"),
    ],
)

# Made by the CLI from every rank's python.collectives (`query --ranks`): probing/sql/derived.py.
COLLECTIVE_TIMINGS = Table(
    "python.collective_timings",
    "Each rank's arrival at each collective, against the other ranks' (query it with --ranks all; made by "
    "the CLI from every rank's python.collectives): who came last, and how long the others waited for it. "
    "Point-to-point operations are left out. Times are the nodes' own clocks.",
    [
        Column("rank", "INTEGER", "the global rank that arrived"),
        Column("node", "INTEGER", "its node (torchrun's GROUP_RANK)"),
        Column("pg_id", "VARCHAR", "process group, as in python.collectives"),
        Column("pg_desc", "VARCHAR", "process group description"),
        Column("seq", "BIGINT", "the group's sequence number of the collective"),
        Column("op", "VARCHAR", "e.g. all_reduce"),
        Column("arrival", "DOUBLE", "when this rank enqueued it, seconds since the epoch (time_created)"),
        Column("late_s", "DOUBLE", "seconds after the first rank's arrival"),
        Column(
            "wait_s", "DOUBLE", "seconds until the last rank's arrival: what this rank waited for the others"
        ),
        Column("last", "BOOLEAN", "whether this rank arrived last (the others waited for it)"),
        Column("ranks_arrived", "BIGINT", "ranks of the query that arrived at it"),
        Column("group_size", "BIGINT", "ranks in the process group"),
        Column(
            "duration_s", "DOUBLE", "from arrival to completion where the recorder saw it (NCCL); else NULL"
        ),
        Column("state", "VARCHAR", "this rank's state of it: scheduled, started, completed"),
    ],
)
