r"""A GPT trained on real text on a (dp x tp) mesh, every step checked against one numpy process.

Character-level text of Python's standard library sources (CPython 3.11.7's, shipped with
spmdsim: the same text on every Python); token and position embeddings, pre-LN blocks
(causal multi-head attention, GELU MLP, residuals, dropout), a final LayerNorm and a
head tied to the token embedding, vocab-parallel cross-entropy,
AdamW. Megatron's splits over tp (column-parallel Q, K, V and fc1 with the heads split,
row-parallel output projections, vocab-parallel embedding and head), the batch over dp,
and with --sp sequence parallelism. Every operator is one of spmdsim's general rules.
Each step's loss, every gradient and every updated parameter is compared with the same
model trained in one numpy process (spmdsim.models.gpt.reference); the largest relative
difference must stay within 1e-10. With --precision bf16-mixed the model computes in bfloat16
with float32 master weights, and the reference runs under the same policy (docs/howto/bf16.md); with
--precision fp8 the linear layers' products are FP8 as TransformerEngine's (e4m3 forward, e5m2 backward,
per-tensor delayed scaling; fp8-current: current scaling). Llama's architecture is options of the same model, flags
spelled as `spmdsim estimate` spells them: --ffn N, --kv-heads N, --norm rms, --mlp swiglu, --untied, --rope, --no-bias
(docs/howto/train-gpt.md, "Llama's options"), each checked as the GPT is.

Run: timeout -k 5 3600 mpiexec -n 8 python examples/train_gpt.py --dp 2 --tp 4 --sp
  or python examples/train_gpt.py --ranks 8 --dp 2 --tp 4 --sp   (8 simulated ranks)
  or in bfloat16: python examples/train_gpt.py --ranks 8 --dp 2 --tp 4 --sp --precision bf16-mixed
  or with GPT-2's odd vocabulary padded to a multiple of 128 x tp, the padded logits masked (docs/howto/train.md):
     python examples/train_gpt.py --ranks 8 --tp 8 --heads 8 --vocab 50257 --pad-vocab-to 1024 --steps 3
  or Llama's architecture (RMSNorm, SwiGLU, grouped-query attention, rotary positions, an untied head, no
     biases): python examples/train_gpt.py --ranks 4 --dp 2 --tp 2 --ffn 352 --kv-heads 2 --norm rms \
         --mlp swiglu --untied --rope --no-bias
  or stopped and resumed, bit for bit as the run that never stopped (docs/howto/checkpoints.md):
     python examples/train_gpt.py --ranks 4 --steps 5 --save ckpt && \
     python examples/train_gpt.py --ranks 4 --steps 10 --resume ckpt
     (or on another dp, tp and sp, resharded: python examples/train_gpt.py --ranks 2 --tp 2 --steps 10 --resume ckpt)
  or over a pipeline (docs/howto/pipelines.md): python examples/train_gpt.py --ranks 8 --pp 2 --tp 2 --dp 2 --sp \
         --microbatches 4 --schedule 1f1b
     (its layers split as Megatron's --decoder-first/last-pipeline-num-layers split them: --first-stage-layers N,
     --last-stage-layers N; or every stage's: --layers 3 --stage-layers 1,2)
  or, GPT-2 medium's shape on 16,384 ranks, shapes only (docs/howto/simulate.md, "Dry runs"):
     python examples/train_gpt.py --ranks 16384 --dry-run --steps 1 --tp 8 --sp --vocab 50304 --layers 24 \
         --d-model 1024 --heads 16 --seq 1024 --batch 2048
"""
import sys
from typing import Any, NamedTuple, Optional

import numpy as np

import spmdsim
from spmdsim.errors import RankCountError, fold_message
from spmdsim.nn.autograd.kept import kept_problem
from spmdsim.base.precision import precision
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.data import show_sample, text_problem
from spmdsim.models.gpt.mesh import model_mesh
from spmdsim.models.gpt.parallel import DIALECTS, dialect_layouts
from spmdsim.models.gpt.pipeline import gathered_stages, train_pipelined
from spmdsim.models.gpt.pipeline_problems import stage_problem
from spmdsim.models.gpt.memory import (memory_line, recompute_problem, reshard_problem, shard_group_problem,
                                       zero_problem)
from spmdsim.models.gpt.options import (architecture_words, check_lines, checkpoint_arguments, context_arguments,
                                        context_line, context_of, default_split, model_arguments, model_config,
                                        padding_line, saved_line, sizes_problem, step_header, step_row,
                                        unused_flags_problem, other_example_flags)
from spmdsim.models.gpt.checkpoint import checkpoint_problem, first_loss, resume_line
from spmdsim.models.gpt.reference import generate
from spmdsim.models.gpt.train import reference_sample, replay_problem, train
from spmdsim.models.gpt.tolerances import failed_steps
from spmdsim.models.axes import model_layout
from spmdsim.models.gpt.fp8_block import policy_problem
from spmdsim.models.nets.train import loss_trend, run_main
from spmdsim.programs.pipeline.options import (layer_split, microbatches, pipeline_arguments,
                                      pipelined, split_words, virtual_stages)
from spmdsim.programs.pipeline.timeline import bubble_formula
from spmdsim.runtime.shared_reference import shared_once
from spmdsim.runtime.sim import dry_run_active
from spmdsim.runtime.sim.dry import note
from spmdsim.base.typed_numbers import add_noted, fixed, flag_float, given_flags, typed  # as typed, flag typed
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed by rank 0 only under mpiexec
from spmdsim.tools.cli.common import check_trace_out
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.base.validate import counted

parser = OnceParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=200, metavar="N", help="training steps (default 200)")
parser.add_argument("--dp", type=int, default=None, help="data-parallel ranks (default: world / tp)")
parser.add_argument("--tp", type=int, default=None, help="tensor-parallel ranks (default: the largest of 4 to 1 the "
                    "world and the model allow)")
parser.add_argument("--sp", action="store_true", help="sequence parallelism (Megatron)")
context_arguments(parser)  # --cp, --cp-method, --cp-split (spmdsim.models.gpt.context)
pipeline_arguments(parser)  # --pp, --microbatches, --schedule, --virtual-stages, the layers' split
parser.add_argument("--trace-out", default=None, metavar="PATH", help="with a pipeline: the last step as a "
                    "Perfetto trace (a track per rank: messages, collectives and the F/B cells); not with --dry-run")
# --vocab, --pad-vocab-to, the sizes, --dropout, --lr, --seed, Llama's (spmdsim.models.gpt.options)
model_arguments(parser)
other_example_flags(parser, moe=False)  # --ep and the like: said to be train_moe_gpt.py's
parser.add_argument("--clip", type=flag_float, default=0.0, help="clip the gradients' joint norm to this (0: none)")
parser.add_argument("--every", type=int, default=20, help="print every N steps")
add_noted(parser, "--sample", type=int, default=120, help="characters to generate at the end (0: none)")
add_noted(parser, "--temperature", type=flag_float, default=0.8, help="sampling temperature (0: greedy)")
parser.add_argument("--no-check", action="store_true", help="skip the single-process reference")
parser.add_argument("--replay", action="store_true",
                    help="capture step 0 and replay it for the later steps (spmdsim.runtime.replay; checked alike)")
parser.add_argument("--dialect", choices=sorted(DIALECTS), default="mindspore",
                    help="the dialect Megatron's parameter layouts are written in (the same layouts)")
parser.add_argument("--recompute", default="none", metavar="{none,selective,full}",
                    help="activation recomputation: the attention core (selective) or each block (full)")
parser.add_argument("--zero", default="0", metavar="{0,1,2,3}",
                    help="1: ZeRO-1, AdamW's states and master copy sharded over dp; 2: ZeRO-2, the gradients "
                         "too (docs/howto/train.md); 3: ZeRO-3, the parameters too (FSDP, docs/howto/fsdp.md)")
add_noted(parser, "--reshard-after-forward", default="true", metavar="{true,false}",
          help="with --zero 3: free each layer's gathered parameters after its forward and gather them "
               "again for its backward (true, FSDP's default), or keep them until the backward (false)")
parser.add_argument("--prefetch", action="store_true",
                    help="with --zero 3: gather the next layer's parameters before each layer's forward, and the "
                         "previous layer's before each layer's backward (FSDP's prefetch)")
parser.add_argument("--shard-group", type=int, default=None, metavar="N",
                    help="with --zero 3: hybrid sharding (HSDP), each parameter sharded over groups of N of the dp "
                         "ranks and replicated across the dp / N groups (default: sharded over all dp ranks)")
parser.add_argument("--memory", action="store_true", help="print rank 0's memory at the last step")
parser.add_argument("--precision", default="fp64", metavar="{fp64,fp32,bf16-mixed,fp8,fp8-current}",
                    help="the precision policy: bf16-mixed computes in bfloat16 with float32 master weights, "
                         "fp8 also the linear layers' products in FP8 (TransformerEngine's delayed scaling; "
                         "fp8-current: current scaling), checked against one numpy process under the same "
                         "policy (docs/howto/bf16.md)")
parser.add_argument("--kept", default="graph", metavar="{graph,megatron}",
                    help="what the graph keeps for backward: megatron, Megatron-LM's set (docs/howto/train.md)")
checkpoint_arguments(parser)  # --save DIR, --save-every N, --resume DIR (spmdsim.models.gpt.checkpoint)
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()


def split(world, cfg, layers=None):
    """(dp, tp) for this world, or the reason it cannot be (the sizes given are at least 1: sizes_problem);
    `layers`: the pipeline's layers per chunk (--first-stage-layers, --last-stage-layers, --stage-layers)."""
    pp, cp = args.pp, args.cp
    if cp < 1 or world % (pp * cp):
        given = " x ".join(f"--{axis} {n}" for axis, n in (("pp", pp), ("cp", cp)) if n > 1) or f"--pp {pp}"
        return None, f"{given} must divide the world size {world}"  # (the flags given, not --pp 1 beside --cp)
    rest = world // (pp * cp)
    over = " x ".join(f"{axis} {n}" for axis, n in (("pp", pp), ("cp", cp)) if n > 1)  # what a stage's ranks are
    for name, given in (("dp", args.dp), ("tp", args.tp)):
        if given is not None and rest % given:
            where = (f"the {counted(rest, 'rank')} {'of a stage' if pp > 1 else 'left'} (world size {world} / "
                     f"{over})") if over else f"the world size {world}"
            return None, f"--{name} {given} must divide {where}"
    if args.tp is None and args.dp is None:  # both left to their default: the first tp of 4 to 1 that runs
        dp, tp, problem = default_split(rest, lambda dp, tp: stage_problem(args, cfg, dp, tp, layers), world,
                                        of=f" (world size {world} / {over})" if over else "")
        return (dp, tp), problem
    tp = args.tp if args.tp is not None else rest // args.dp
    dp = args.dp if args.dp is not None else rest // tp
    if pp * dp * cp * tp != world:
        what = f"pp {pp} x dp {dp} x tp {tp}" if pp > 1 else f"dp {dp} x cp {cp} x tp {tp}" if cp > 1 else \
            f"dp {dp} x tp {tp}"
        return None, f"{what} must multiply to the world size {world}: e.g. --dp {rest // tp} --tp {tp}"
    return (dp, tp), stage_problem(args, cfg, dp, tp, layers)


class Run(NamedTuple):
    """What a checked command line runs: the model, its mesh and layers, ZeRO's stage, the text, the check."""
    comm: Any  # MPI.COMM_WORLD under mpiexec, this thread's rank under --ranks
    cfg: GPTConfig
    dp: int
    tp: int
    layers: Optional[tuple]  # the pipeline's layers per chunk; None: balanced
    zero: int
    text: str
    ids: np.ndarray  # the text's token ids
    layouts: dict  # each parameter's layout: Megatron's, written in --dialect and read back
    check: bool  # each step compared with one numpy process


def main(args):
    """One rank's run (MPI or simulated): check, train, report; the exit code every rank agrees on."""
    comm = spmdsim.world()
    run = checked_run(args, comm.size)._replace(comm=comm)
    model, results = train_steps(args, run, print_header(args, run) if run.comm.rank == 0 else [])  # header first
    ok = report_results(args, run, results)
    if pipelined(args) and not dry_run_active():
        report_schedule(args, run, model)
    ok = draw_sample(args, run, model) and ok
    model.close() if pipelined(args) else model.mesh.close()
    return 0 if ok else 1


def checked_run(args, size):
    """The Run the command line asks for on `size` ranks (comm None: main's), or its refusal in one line (exit 2)
    on every rank alike; run_main asks it first, before the banner of --ranks N."""
    problem = sizes_problem(args) or unused_flags_problem(args)  # --cp-method without --cp, --save-every without --save
    if problem:  # every rank alike, before any collective
        raise spmdsim.SpmdsimError(problem)
    cfg = model_config(args, clip=args.clip)
    layers, problem = layer_split(args, cfg.layers, args.pp, virtual_stages(args))  # None: balanced
    if problem:  # every rank alike, before any collective
        raise spmdsim.SpmdsimError(problem)
    shape, problem = split(size, cfg, layers)
    if problem:  # every rank alike, before any collective
        raise RankCountError(f"the GPT cannot run on {counted(size, 'rank')}: {problem}", size=size, ways=problem)
    zero = int(args.zero) if args.zero.lstrip("-").isdigit() else args.zero
    problem = options_problem(args, cfg, zero, shape[0])
    text = load_text()
    ids = encode(text)
    problem = problem or text_problem(ids, cfg)
    if problem:  # every rank alike, before any collective
        raise spmdsim.SpmdsimError(problem)
    check_trace_out(args)  # an unwritable trace file refused now, not after the run (alike on every rank)
    dp, tp = shape
    layouts = dialect_layouts(cfg, spmdsim.Layout(*model_layout(tp, dp, cp=args.cp if args.cp > 1 else None)),
                              args.dialect, args.sp)
    if args.save is not None or args.resume is not None or args.save_every:
        # Each rank reads the same metadata file: alike on every rank, before any collective.
        pipeline = {"pp": args.pp, "schedule": args.schedule, "microbatches": microbatches(args),
                    "virtual": virtual_stages(args), "split": layers} if pipelined(args) else None
        problem = checkpoint_problem(cfg, size, dp, tp, args.steps, sp=args.sp, layouts=layouts,
                                     precision=args.precision, zero=zero, save=args.save, cp=args.cp,
                                     save_every=args.save_every, resume=args.resume, pipeline=pipeline,
                                     fs=args.shard_group or 0)
        if problem:
            raise spmdsim.SpmdsimError(problem)
    check = not args.no_check and not dry_run_active()
    return Run(None, cfg, dp, tp, layers, zero, text, ids, layouts, check)


def options_problem(args, cfg, zero, dp):
    """Why the replay, memory, sharding, precision, sample and trace options cannot run together, or None (pure)."""
    problem = replay_problem(cfg) if args.replay else None
    problem = problem or recompute_problem(args.recompute, "--recompute") or zero_problem(zero, "--zero") \
        or kept_problem(args.kept, "--kept")
    reshard = bool(given_flags(args, "--reshard-after-forward"))  # its default runs without --zero 3 too
    problem = problem or reshard_problem(args.reshard_after_forward, zero, reshard)
    if not problem and args.prefetch and zero != 3:
        problem = "--prefetch gathers parameters ahead: give --zero 3 with it"
    if not problem and args.sample == 0 and given_flags(args, "--temperature"):
        problem = f"--temperature {typed(args.temperature)} is the sample's: give --sample N above 0 with it"
    pipe = [flag for flag, given in (("--prefetch", args.prefetch), ("--shard-group", args.shard_group is not None),
                                     ("--reshard-after-forward false", args.reshard_after_forward == "false")) if given]
    if not problem and pipe and pipelined(args):  # a pipeline's chunks reshard after forward, over all of dp
        problem = f"{pipe[0]} with a pipeline: its chunks are fully sharded over dp and resharded after forward"
    if not problem and args.shard_group is not None:
        problem = shard_group_problem(args.shard_group, zero, dp)
    problem = problem or policy_problem(args.precision, args.replay)  # FP8's options too, before the header
    if not problem and args.trace_out and not pipelined(args):
        problem = "--trace-out writes a pipeline's last step; give --pp (or --microbatches) with it"
    if not problem and args.trace_out and dry_run_active():  # its trace would time cells that computed nothing
        problem = ("--trace-out writes the last step's cells as they ran and took time; a dry run computes "
                   "nothing to time: leave out --trace-out or --dry-run")
    return problem


def print_header(args, run):
    """Print (rank 0) the model, the text, the mesh and what runs on it, then the steps' table header; resuming,
    return the resume line and that header instead: train_steps prints them once every rank's load succeeded."""
    cfg, dp, tp = run.cfg, run.dp, run.tp
    print(f"GPT: {counted(cfg.layers, 'layer')}, d_model {cfg.d_model}, {cfg.heads} heads, seq {cfg.seq}, "
          f"batch {cfg.batch}, dropout {cfg.dropout}")
    if architecture_words(cfg):  # Llama's options, those that differ from the GPT's
        print("architecture:" + architecture_words(cfg)[1:])
    print(f"text: {len(run.text):,} characters of Python's standard library sources (character level)")
    clipped = f", gradients' norm clipped to {cfg.clip}" if cfg.clip else ""
    mesh = f"{f'pp {args.pp} x ' if args.pp > 1 else ''}dp {dp} x {f'cp {args.cp} x ' if args.cp > 1 else ''}tp {tp}"
    sp = " with sequence parallelism" + (" (a no-op: tp 1 splits nothing)" if tp == 1 else "") if args.sp else ""
    print(f"mesh {mesh}{sp}; AdamW lr {cfg.lr}{clipped}")
    if args.shard_group is not None and args.shard_group < dp:
        print(f"hybrid sharding: parameters sharded over groups of {args.shard_group} dp ranks"
              f"{f' and the {args.cp} cp ranks' if args.cp > 1 else ''}, replicated over {dp // args.shard_group}")
    if padding_line(cfg, tp):
        print(padding_line(cfg, tp))
    if context_line(args):
        print(context_line(args))
    if pipelined(args):
        v = f", {virtual_stages(args)} chunks per stage" if args.schedule == "interleaved" else ""
        m = microbatches(args)
        print(f"pipeline: {args.schedule} schedule, {counted(m, 'microbatch')} of {cfg.batch // m}"
              f"{v}; gradients accumulated, reduced once per step")
        if run.layers is not None:
            print(f"layers per {'chunk' if virtual_stages(args) > 1 else 'stage'}: {split_words(run.layers)}")
    if args.recompute != "none" or run.zero or args.kept != "graph":
        print(memory_line(args, run.zero, run.dp == 1 and args.cp == 1))
    if args.precision != "fp64":
        policy = precision(args.precision)
        print(f"precision {policy.name}: parameters {policy.param}, activations {policy.activation}, "
              f"gradients {policy.grad},\n  master copy {policy.master or 'none'}, optimizer states "
              f"{policy.optimizer}")
    words = DIALECTS[args.dialect]
    print(f"layouts in {args.dialect}: column-parallel {words['columns']}, row-parallel {words['rows']}")
    if args.resume is None:
        print(step_header(run.check))
        return []
    return [fold_message(resume_line(args.resume, dp, tp, args.sp, pp=pipelined(args) and args.pp, cp=args.cp,
                                     zero=run.zero, precision=args.precision, fs=args.shard_group or 0)),
            step_header(run.check)]


def train_steps(args, run, resumed):
    """Train --steps steps over the pipeline or the mesh, rank 0 printing `resumed` then every --every-th step's row."""
    cfg, comm, dp, tp = run.cfg, run.comm, run.dp, run.tp

    def report(r):
        while resumed:  # at the first step, once every rank's load succeeded: a refused resume says that alone
            print(resumed.pop(0))
        if comm.rank == 0 and (r.step % args.every == 0 or r.step == args.steps - 1):
            print(step_row(r, run.check))

    if pipelined(args):
        return train_pipelined(cfg, comm, args.pp, dp, tp, args.steps, run.ids, sp=args.sp,
                               schedule=args.schedule, microbatches=microbatches(args),
                               virtual=virtual_stages(args), split=run.layers,
                               check=run.check, on_step=report, layouts=run.layouts, recompute=args.recompute,
                               zero=run.zero, memory=args.memory, kept=args.kept, replay=args.replay,
                               precision=args.precision, save=args.save, save_every=args.save_every,
                               resume=args.resume, cp=args.cp, context=context_of(args))
    mesh, layouts = None, run.layouts
    if args.shard_group is not None and args.shard_group < dp:  # HSDP: (dp / N, N, [cp,] tp), the batch over dp, N
        mesh = model_mesh(cfg, comm, dp, tp, cp=args.cp, context=context_of(args), zero=run.zero, fs=args.shard_group)
        layouts = dialect_layouts(cfg, mesh.layout, args.dialect, args.sp)  # Megatron's, on that mesh
    return train(cfg, comm, dp, tp, args.steps, run.ids, sp=args.sp, check=run.check, on_step=report, mesh=mesh,
                 layouts=layouts, replay=args.replay, recompute=args.recompute, zero=run.zero,
                 memory=args.memory, kept=args.kept, precision=args.precision, save=args.save,
                 save_every=args.save_every, resume=args.resume, cp=args.cp, context=context_of(args),
                 reshard_after_forward=args.reshard_after_forward == "true", prefetch=args.prefetch)


def report_results(args, run, results):
    """Print (rank 0) the check, the loss's trend, the clipping and --memory; whether all passed and the loss fell."""
    rank0, cfg = run.comm.rank == 0, run.cfg
    if rank0 and args.save is not None:
        print(saved_line(args, run.comm.size))
    trend, falling = loss_trend([r.loss for r in results], first=first_loss(args.resume), lr=args.lr)
    failed = failed_steps(results)[0]  # (a few FP8 flips pass: docs/explanation/tolerances.md)
    if rank0 and (lines := check_lines(results, cfg, args.precision, run.check)):  # unchecked: its overflow
        print("\n".join(lines))
    if rank0:
        print(trend)
    if cfg.clip and rank0 and results and results[0].norm is not None:  # the norm over every stage
        clipped = sum(r.norm > cfg.clip for r in results)
        first, last = fixed(results[0].norm, 4), fixed(results[-1].norm, 4)
        print(f"gradients' norm before clipping: first {first}, last {last}; "
              f"clipped to {cfg.clip} at {clipped} of {len(results)} steps")
    if args.memory and rank0 and results:
        if dry_run_active():
            # Below the dry run's report (the program's own output is not shown); its "peak held B" column counts
            # the blocks seeds and collectives make, not the local ones this ledger counts by role.
            note("--memory: the step's ledger by role (the table's peak held leaves out local blocks)",
                 *results[-1].memory.lines())
        else:
            print("\n".join(results[-1].memory.lines()))
    return not failed and falling


def report_schedule(args, run, model):
    """Print the pipeline's last step on a unit-cost timeline, its bubble beside the formula's; --trace-out's trace."""
    line, held = model.timeline(), model.held()
    formula = bubble_formula(args.schedule, args.pp, microbatches(args), virtual_stages(args))
    if run.comm.rank == 0:
        print(f"executed schedule (last step, unit cost per cell): bubble {float(line.bubble):.3f}, "
              f"formula {float(formula):.3f}")
        print(f"most microbatch-chunks whose activations a stage held at once: {', '.join(map(str, held))}")
    if args.trace_out:
        model.write_trace(args.trace_out)
        if run.comm.rank == 0:
            print(f"trace of the last step written to {args.trace_out} (open it in https://ui.perfetto.dev)")


def draw_sample(args, run, model):
    """Print --sample characters drawn after "def "; False where they differ from one numpy process's draw."""
    if not args.sample or dry_run_active():
        if args.sample and run.comm.rank == 0 and given_flags(args, "--sample", "--temperature"):  # asked for: say so
            note(f"--sample {args.sample}: no sample drawn (a dry run has shapes, not trained weights)")
        return True
    cfg, rank0, prompt = run.cfg, run.comm.rank == 0, b"def "
    if pipelined(args) or args.cp > 1:
        # One numpy process draws from the trained parameters, made whole on every rank: the pipeline's stages, or
        # the context-parallel ranks' (a window of one new token does not split over them).
        if pipelined(args):
            sample = shared_once(model.mesh, ("gpt-sample", cfg), generate, gathered_stages(model, cfg), cfg, prompt,
                                 args.sample, args.temperature)  # one rank draws for all
        else:
            sample = reference_sample(model, cfg, prompt, args.sample, args.temperature)
        if rank0:
            print(f"sample (temperature {args.temperature}, drawn in one numpy process from the trained "
                  f"{'stages' if pipelined(args) else 'parameters'}):")
            show_sample(prompt, sample)
        return True
    # Said before it runs from 64 ranks (a forward pass a character; 120: 7 s on 8 ranks, 50 s on 64, 17 min on 1,024)
    if rank0 and run.comm.size >= 64:
        print(f"drawing {args.sample} characters: {args.sample} forward passes on {run.comm.size:,} ranks "
              "(--sample 0 skips them)", file=sys.stderr, flush=True)
    sample = model.generate(prompt, args.sample, args.temperature)
    same, agree = "", True
    if run.check and args.precision != "fp64":  # the reference draws at float64: not the same computation
        same = f", {args.precision}, not compared"
    elif run.check:  # the single-process model with these parameters draws the same characters
        ids = reference_sample(model, cfg, prompt, args.sample, args.temperature)  # one rank draws for all
        agree = bool((ids == sample).all())
        same = ", as one numpy process" if agree else ", NOT as one numpy process"
    if rank0:
        print(f"sample (temperature {args.temperature}{same}):")
        show_sample(prompt, sample)
    return agree


# Simulated ranks with --ranks, else MPI; the command line refused before anything starts.
sys.exit(run_main(main, args, args.ranks, checks=lambda size: checked_run(args, size)))
