r"""A mixture-of-experts GPT trained on ep x dp x tp ranks, every step checked against one numpy process.

The GPT of examples/train_gpt.py (the same text, embeddings, attention, head and AdamW) with every
other block's MLP an MoE layer (spmdsim.models.moe, docs/howto/experts.md): a router (linear, softmax in float64,
top-k), experts split over the ep ranks, each expert column- then row-parallel over tp, the tokens
sent to their experts and back by Alltoall over ep (with a capacity: tokens past it dropped) or, with
--dropless, an Alltoall of the counts then an Alltoallv of the tokens with the true counts. The batch
is split over dp x ep in every other layer (the ep ranks are data parallel there, as in Megatron);
an expert's gradients are summed over dp alone. The loss adds the Switch load-balancing loss and the
router z-loss. Each step's loss, every gradient and every updated parameter is compared with the same
model trained in one numpy process (spmdsim.models.gpt.reference); the largest relative difference must stay
within 1e-10. --dispatch prints who sent how many tokens to whom, the tokens per expert and the drops;
--memory the last step's bytes on rank 0, the experts' among them (parameters, gradients, optimizer states, dispatch
buffers and bytes sent), which a dry run (--ranks N --dry-run) prints below its report, for the
routing --routing names (balanced, or worst: every token to experts 0..k-1).

With --etp below --tp the experts have a tensor-parallel size of their own (Megatron-Core's parallel
folding, docs/howto/experts-folding.md): --etp 1, whole experts over --ep ranks that fold in attention's tp
ranks, each tp rank routing its own share of the tokens; --etp N dividing --tp, each expert split over N ranks
and the other tp / N folded into --ep (the mesh's tp is then two axes, ("tp", "etp")); --dp is then the
experts' data-parallel size.

With --pp the blocks are cut into pipeline stages (docs/howto/pipelines.md; --microbatches, --schedule,
--virtual-stages as examples/train_gpt.py has them): each stage is a dp x ep x tp mesh whose MoE layers
exchange tokens over its own ep groups and add their router losses, each microbatch's scaled by 1/m.

Run: timeout -k 5 900 mpiexec -n 8 python examples/train_moe_gpt.py --ep 4 --tp 2
  or python examples/train_moe_gpt.py --ranks 8 --ep 2 --dp 2 --tp 2 --dropless   (8 simulated ranks)
  or stopped and resumed (--save DIR, --resume DIR; docs/howto/checkpoints.md): as train_gpt.py
  or over a pipeline: python examples/train_moe_gpt.py --ranks 8 --pp 2 --ep 2 --tp 2 --microbatches 4
  or folded: python examples/train_moe_gpt.py --ranks 8 --ep 8 --tp 2 --etp 1
  or partly folded: python examples/train_moe_gpt.py --ranks 8 --ep 4 --tp 4 --etp 2
  or each sequence over cp: python examples/train_moe_gpt.py --ranks 8 --ep 2 --cp 2 --tp 2 --dropless
  or, 64 experts on 1,024 ranks, shapes only (docs/howto/experts-memory.md, "The dry run"):
     python examples/train_moe_gpt.py --ranks 1024 --dry-run --steps 1 --experts 64 --ep 64 --tp 8 \
         --layers 4 --d-model 1024 --heads 16 --seq 1024 --batch 128 --dropless --routing worst
"""
import sys
from typing import Any, NamedTuple, Optional

import spmdsim
from spmdsim.errors import RankCountError, fold_message
from spmdsim.nn.autograd.kept import kept_problem
from spmdsim.base.precision import precision
from spmdsim.models.gpt.fp8_block import policy_problem
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.data import text_problem
from spmdsim.models.gpt.layouts import written
from spmdsim.models.gpt.memory import zero_problem
from spmdsim.models.gpt.mesh import zero_cut
from spmdsim.models.gpt.parallel import DIALECTS, dialect_layouts
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.pipeline_problems import stage_problem
from spmdsim.models.gpt.checkpoint import checkpoint_problem, first_loss, resume_line
from spmdsim.models.gpt.train import replay_problem, train
from spmdsim.models.gpt.tolerances import failed_steps
from spmdsim.models.axes import model_layout
from spmdsim.models.moe import MoEConfig
from spmdsim.models.moe.fold import fold_problem, fold_words, folded_tp
from spmdsim.models.moe.routing import ROUTINGS
from spmdsim.models.moe.report import dispatch_lines
from spmdsim.models.nets.train import loss_trend, run_main
from spmdsim.models.gpt.options import (architecture_words, check_lines, checkpoint_arguments, context_arguments,
                                        context_line, context_of, default_split, model_arguments, model_config,
                                        moe_problem, padding_line, routing_problem, saved_line, sizes_problem,
                                        step_header, step_row, unused_flags_problem, other_example_flags)
from spmdsim.programs.pipeline.options import (layer_split, microbatches, pipeline_arguments,
                                      pipelined, split_words, virtual_stages)
from spmdsim.runtime.door import gather_object
from spmdsim.runtime.sim import dry_run_active
from spmdsim.runtime.sim.dry import note
# A refusal names the value as typed ("-1", not "-1.0"), and --capacity-factor beside --dropless only where typed.
from spmdsim.base.typed_numbers import add_noted, flag_float
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed by rank 0 only under mpiexec
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.base.validate import counted

parser = OnceParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=50, metavar="N", help="training steps (default 50)")
parser.add_argument("--ep", type=int, default=None, help="expert-parallel ranks (default: world / (dp x tp))")
parser.add_argument("--dp", type=int, default=None,
                    help="expert-data-parallel ranks: replicas of each expert (default: world / (ep x tp))")
parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks, inside the experts too")
parser.add_argument("--etp", type=int, default=None,
                    help="the experts' tensor-parallel ranks (Megatron's --expert-tensor-parallel-size): tp (the "
                         "default) or a divisor of tp, the rest of attention's tp ranks folded into the experts' ep "
                         "(Megatron-Core's parallel folding; --ep then counts them: etp x ep x dp = world / pp)")
parser.add_argument("--sp", action="store_true", help="sequence parallelism in the non-expert layers (Megatron)")
context_arguments(parser)  # --cp, --cp-method, --cp-split: each sequence split over cp, in the experts too
pipeline_arguments(parser)  # --pp, --microbatches, --schedule, --virtual-stages, the layers' split
parser.add_argument("--experts", type=int, default=8, metavar="N", help="experts in each MoE layer (default 8)")
parser.add_argument("--top-k", type=int, default=2, help="experts per token: 1 (Switch) or 2")
parser.add_argument("--moe-every", type=int, default=2, help="every N-th block's MLP is an MoE layer")
add_noted(parser, "--capacity-factor", type=flag_float, default=1.25,
          help="each expert's slots per sequence: ceil(top_k x seq x factor / experts), at most seq "
               "(experts / top_k or more drops nothing; default 1.25; not with --dropless)")
parser.add_argument("--dropless", action="store_true",
                    help="no capacity: the counts by Alltoall, then the tokens by Alltoallv")
parser.add_argument("--routing", choices=ROUTINGS, default=None,
                    help="a dry run's routing (it has no values to route by): balanced, or worst (every token "
                         "to experts 0..k-1); needed with --dropless, balanced by default with a capacity")
parser.add_argument("--memory", action="store_true",
                    help="print the last step's bytes on rank 0: what the graph kept, parameters, optimizer, and "
                         "the experts' (a dry run prints the experts' anyway)")
parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                    help="selective: the attention core recomputed in the backward; full: each block, its MoE layer "
                         "routing and exchanging its tokens again (docs/howto/experts.md)")
parser.add_argument("--kept", default="graph", metavar="{graph,megatron}",
                    help="what the blocks keep for backward: the graph's inputs, or Megatron's set "
                         "(docs/howto/train.md); the MoE layers keep what their backward reads under either")
parser.add_argument("--dialect", choices=sorted(DIALECTS), default=None,
                    help="write Megatron's parameter layouts in this dialect (read back by "
                         "spmdsim.layouts.dialects: the same layouts; default: spmdsim's own)")
parser.add_argument("--zero", default="0", metavar="{0,1,2,3}",
                    help="1: ZeRO-1, AdamW's states and master copy sharded: the dense layers' over dp x ep, the "
                         "experts' over dp (docs/howto/experts.md); 2: ZeRO-2, the gradients too; 3: ZeRO-3, the "
                         "parameters too, gathered for each layer (docs/howto/fsdp.md)")
parser.add_argument("--precision", default="fp64", metavar="{fp64,fp32,bf16-mixed,fp8,fp8-current}",
                    help="the precision policy (docs/howto/train.md): bf16-mixed computes in bfloat16, the router in "
                         "float32 (docs/howto/experts.md); fp8 and fp8-current also the dense layers' linear "
                         "products in FP8, the experts' in bfloat16 (docs/howto/bf16.md)")
parser.add_argument("--aux-loss-coeff", type=flag_float, default=MoEConfig.aux_loss_coeff, metavar="C",
                    help=f"weight of the Switch load-balancing loss (default {MoEConfig.aux_loss_coeff:g})")
parser.add_argument("--z-loss-coeff", type=flag_float, default=MoEConfig.z_loss_coeff, metavar="C",
                    help=f"weight of the router z-loss (default {MoEConfig.z_loss_coeff:g})")
parser.add_argument("--algorithm", choices=("pairwise", "bruck"), default=None,
                    help="run the Alltoalls as this emulated algorithm (docs/explanation/algorithms.md); "
                         "pairwise runs the dropless Alltoallv too (bruck has no Alltoallv: it stays the engine's)")
parser.add_argument("--replay", action="store_true",
                    help="capture step 0 and replay it for the later steps (spmdsim.runtime.replay; checked alike)")
parser.add_argument("--dispatch", action="store_true",
                    help="print each reported step's dispatch of the first MoE layer: tokens rank -> rank, "
                         "per expert, dropped")
# --vocab, --pad-vocab-to, the sizes, --dropout, --lr, --seed, Llama's (spmdsim.models.gpt.options)
model_arguments(parser)
other_example_flags(parser, moe=True)  # --sample and the like: said to be train_gpt.py's
parser.add_argument("--every", type=int, default=10, help="print every N steps")
parser.add_argument("--no-check", action="store_true", help="skip the single-process reference")
checkpoint_arguments(parser)  # --save DIR, --save-every N, --resume DIR (spmdsim.models.gpt.checkpoint)
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()


def split(world, cfg, layers):
    """(dp, ep, tp) of each pipeline stage (the whole world without --pp) and why the model cannot run on it (the
    sizes given are at least 1: sizes_problem; stage_problem), or None and why; --cp's ranks beside them. Neither
    --ep nor --dp: the largest ep that runs."""
    pp, tp, cp = args.pp, args.tp, args.cp
    if world % (pp * cp):
        given = " x ".join(f"--{axis} {n}" for axis, n in (("pp", pp), ("cp", cp)) if n > 1) or f"--pp {pp}"
        return None, f"{given} must divide the world size {world}"  # (the flags given, not --pp 1 beside --cp)
    if (world // (pp * cp)) % tp:
        stage = " x ".join(f"{axis} {n}" for axis, n in (("pp", pp), ("cp", cp)) if n > 1)
        where = (f"the {counted(world // (pp * cp), 'rank')} {'of a stage' if pp > 1 else 'left'} (world size "
                 f"{world} / {stage})") if stage else f"the world size {world}"
        return None, f"--tp {tp} must divide {where}"
    rest = world // (pp * cp) // tp
    by = folded_tp(tp, args.etp or 0)  # the tp ranks each folded experts' group takes into its ep
    rest *= by  # the experts' groups: etp x ep x dp = the stage's ranks; the mesh's "ep" axis ep / by of them
    etp = args.etp if folded(args) else tp
    over = " x ".join(f"{axis} {n}" for axis, n in (("pp", pp), ("cp", cp), ("etp" if etp != tp else "tp", etp))
                      if n > 1)  # (folded: the stage's ranks over the experts' tp, not attention's)
    for name, given in (("ep", args.ep), ("dp", args.dp)):
        if given is not None and rest % given:
            where = f"the {counted(rest, 'rank')} left (world size {world} / {over})" if over else \
                f"the world size {world}"
            return None, f"--{name} {given} must divide {where}"
    if args.ep is None and args.dp is None:  # (folded: ep counts the experts' groups, the mesh's axis ep / by)
        def problem_of(dp, ep):
            fold = folded(args) and fold_problem(tp, args.etp, ep)
            return f"--etp {args.etp}: {fold}" if fold else stage_problem(args, cfg, dp, tp, layers, ep // by)
        of = f" (world size {world} / {over})" if over else ""
        dp, ep, problem = default_split(rest, problem_of, world, "ep", 0, of)
        return (None, problem) if problem else ((dp, ep // by, tp), None)  # (its stage_problem None)
    ep = args.ep if args.ep is not None else rest // args.dp
    dp = args.dp if args.dp is not None else rest // ep
    if pp * dp * ep * cp * etp != world:
        what = f"pp {pp} x dp {dp} x ep {ep} x {f'cp {cp} x ' if cp > 1 else ''}{'e' if etp != tp else ''}tp {etp}"
        return None, f"{what if pp > 1 else what[what.index('dp'):]} must multiply to the world size {world}: e.g. " \
                     f"--dp {rest // ep} --ep {ep}"
    if folded(args):
        problem = fold_problem(tp, args.etp, ep)
        if problem:
            return None, f"--etp {args.etp}: {problem}"
    return (dp, ep // by, tp), stage_problem(args, cfg, dp, tp, layers, ep // by)


def stage_mesh(dp, ep, tp):
    """A stage's mesh, (device matrix, axis names): (dp, ep, tp), with --cp's axis before tp; tp as the two axes
    ("tp", "etp") with --etp between 1 and --tp."""
    return model_layout(tp, dp, ep=ep, cp=args.cp if args.cp > 1 else None, etp=args.etp if folded(args) else 0)


def folded(args):
    """Whether the experts fold attention's tp into their ep (--etp below --tp, dividing it: moe_problem)."""
    return folded_tp(args.tp, args.etp or 0) > 1


class Run(NamedTuple):
    """What a checked command line runs: the model, a stage's (dp, ep, tp) mesh and layers, ZeRO's stage, the tokens."""
    comm: Any  # MPI.COMM_WORLD under mpiexec, this thread's rank under --ranks
    cfg: GPTConfig  # its MoEConfig: cfg.moe
    dp: int
    ep: int
    tp: int
    layers: Optional[tuple]  # the pipeline's layers per chunk; None: balanced
    zero: int
    ids: Any  # the text's token ids
    layouts: Optional[dict]  # Megatron's, written in --dialect and read back; None: spmdsim's own
    algorithms: Optional[dict]  # the Alltoalls' emulated algorithms (--algorithm)
    mesh: Any  # the (dp, ep, tp) mesh; None with a pipeline (each stage makes its own)
    check: bool  # each step compared with one numpy process
    moe_layers: list  # the blocks whose MLP is an MoE layer ("h1", "h3", ...)


def main(args):
    """One rank's run (MPI or simulated): check, train, report; the exit code every rank agrees on."""
    comm = spmdsim.world()
    run = checked_run(args, comm.size)
    layout = spmdsim.Layout(*stage_mesh(run.dp, run.ep, run.tp), zero_cut(run.zero))  # (a pipeline: each stage's)
    mesh = None if pipelined(args) else spmdsim.Mesh(layout, comm, algorithms=run.algorithms)
    run = run._replace(comm=comm, mesh=mesh)
    model, results = train_steps(args, run, print_header(args, run) if run.comm.rank == 0 else [])  # header first
    ok = report_results(args, run, results)
    model.close() if pipelined(args) else model.mesh.close()
    return 0 if ok else 1


def checked_config(args):
    """The MoE GPT's GPTConfig, or the refusal of its flags in one line (exit 2) on every rank alike."""
    problem = routing_problem(args) or sizes_problem(args) or moe_problem(args) or unused_flags_problem(args)
    if problem:  # (--moe-every past --layers among them: a dense GPT, printing experts it does not have)
        raise spmdsim.SpmdsimError(problem)
    moe = MoEConfig(experts=args.experts, top_k=args.top_k, every=args.moe_every,
                    capacity_factor=args.capacity_factor, dropless=args.dropless,
                    aux_loss_coeff=args.aux_loss_coeff, z_loss_coeff=args.z_loss_coeff,
                    dry_routing=args.routing or "balanced", etp=args.etp if folded(args) else 0)
    return model_config(args, moe=moe)


def checked_run(args, size):
    """The Run the command line asks for on `size` ranks (comm and mesh None: main's), or its refusal in one line
    (exit 2) on every rank alike; run_main asks it first, before the banner of --ranks N."""
    cfg = checked_config(args)
    layers, problem = layer_split(args, cfg.layers, args.pp, virtual_stages(args))  # None: balanced
    if problem:  # every rank alike, before any collective
        raise spmdsim.SpmdsimError(problem)
    zero = int(args.zero) if args.zero.lstrip("-").isdigit() else args.zero
    shape, problem = split(size, cfg, layers)  # (with its mesh's, pipeline's and --cp's problem)
    if problem:
        raise RankCountError(f"the MoE GPT cannot run on {counted(size, 'rank')}: {problem}", size=size, ways=problem)
    ids = encode(load_text())  # the rest are the flags' own, on any number of ranks (as train_gpt.py says them):
    problem = (replay_problem(cfg) if args.replay else None) or kept_problem(args.kept, "--kept") \
        or policy_problem(args.precision, args.replay) or text_problem(ids, cfg) or zero_problem(zero, "--zero")
    if problem:  # FP8's options too: refused before the header, not by the trainer
        raise spmdsim.SpmdsimError(problem)
    dp, ep, tp = shape
    layouts = None
    if args.dialect:  # Megatron's plan written in the dialect, read back: the same layouts (a stage's mesh too)
        layouts = dialect_layouts(cfg, spmdsim.Layout(*stage_mesh(dp, ep, tp)), args.dialect, args.sp)
    if args.save is not None or args.resume is not None or args.save_every:
        # Each rank reads the same metadata file: alike on every rank, before any collective.
        pipeline = {"pp": args.pp, "schedule": args.schedule, "microbatches": microbatches(args),
                    "virtual": virtual_stages(args), "split": layers} if pipelined(args) else None
        problem = checkpoint_problem(cfg, size, dp, tp, args.steps, sp=args.sp, layouts=layouts,
                                     precision=args.precision, zero=zero, ep=ep, save=args.save, cp=args.cp,
                                     save_every=args.save_every, resume=args.resume, pipeline=pipeline)
        if problem:
            raise spmdsim.SpmdsimError(problem)
    algorithms = {"alltoall": args.algorithm} if args.algorithm else None
    if args.algorithm == "pairwise":  # the only emulated Alltoallv (spmdsim.programs.algorithms.VARIABLE)
        algorithms["alltoallv"] = "pairwise"
    moe_layers = [f"h{i}" for i in range(cfg.layers) if cfg.is_moe(i)]
    return Run(None, cfg, dp, ep, tp, layers, zero, ids, layouts, algorithms, None, not args.no_check, moe_layers)


def print_header(args, run):
    """Print (rank 0) the model, its experts and their capacity, the mesh and what runs on it, the table header;
    resuming, return the resume line and that header instead: train_steps prints them once every rank's load
    succeeded."""
    cfg, moe = run.cfg, run.cfg.moe
    print(f"MoE GPT: {counted(cfg.layers, 'layer')} ({', '.join(run.moe_layers) or 'none'} MoE), d_model "
          f"{cfg.d_model}, {cfg.heads} heads, seq {cfg.seq}, batch {cfg.batch}, dropout {cfg.dropout}")
    if architecture_words(cfg):  # Llama's options, those that differ from the GPT's
        print("architecture:" + architecture_words(cfg)[1:])
    print(f"experts: {moe.describe()}")
    if args.dialect:
        def said(role: str, ndim: int) -> str:
            return str(written(args.dialect, role, ndim, stage_mesh(run.dp, run.ep, run.tp)[1], folded(args)))
        print(f"layouts in {args.dialect}: experts' w1 {said('expert w1', 3)}, w2 {said('expert w2', 3)};\n"
              f"  column-parallel {said('columns', 2)}, row-parallel {said('rows', 2)}")
    if args.precision != "fp64":
        policy = precision(args.precision)
        print(f"precision {policy.name}: parameters {policy.param}, activations {policy.activation}, "
              f"gradients {policy.grad};\n  the router in float32")
    print(moe.describe_capacity(cfg.seq))
    print(mesh_lines(args, run))
    if padding_line(cfg, run.tp):
        print(padding_line(cfg, run.tp))
    if context_line(args):
        print(context_line(args))
    if pipelined(args):
        m, v = microbatches(args), virtual_stages(args)
        chunks = f", {v} chunks per stage" if args.schedule == "interleaved" else ""
        print(f"pipeline: {args.schedule} schedule, {counted(m, 'microbatch')} of {cfg.batch // m}{chunks}")
        if run.layers is not None:
            print(f"  layers per {'chunk' if v > 1 else 'stage'}: {split_words(run.layers)}")
        print(f"  each stage's MoE layers exchange tokens over its own ep groups; router losses scaled by 1/{m}")
    if args.resume is None:
        print(step_header(run.check))
        return []
    return [fold_message(resume_line(args.resume, run.dp, run.tp, args.sp, pp=pipelined(args) and args.pp,
                                     cp=args.cp, zero=run.zero, ep=run.ep, etp=run.cfg.expert_tp,
                                     precision=args.precision)), step_header(run.check)]


def mesh_lines(args, run):
    """The header's words on the mesh, the experts per rank and the Alltoalls' algorithm, within 100 columns."""
    dp, ep, tp = run.dp, run.ep, run.tp
    both = "Alltoall and Alltoallv" if args.dropless and args.algorithm == "pairwise" else "Alltoall"
    alg = f"; {both} as {args.algorithm}" if args.algorithm else ""
    split_tp = f" (tp {tp // args.etp} x etp {args.etp})" if folded(args) and args.etp > 1 else ""
    parts = [f"mesh {f'pp {args.pp} x ' if pipelined(args) else ''}dp {dp} x ep {ep} x "
             f"{f'cp {args.cp} x ' if args.cp > 1 else ''}tp {tp}{split_tp}"
             f"{(' with sequence parallelism' + ' (a no-op: tp 1 splits nothing)' * (tp == 1)) * args.sp}:",
             f"experts {run.cfg.moe.experts // ep} per ep rank, batch over dp x ep = {dp * ep}" + (alg and ";"),
             alg[2:]]
    if folded(args):  # Megatron-Core's parallel folding: the experts' groups over the same ranks
        words = fold_words(run.cfg, dp, ep, tp)
        parts[1:2] = words[:-1] + [words[-1] + (alg and ";")]
    lines = [parts[0]]
    for part in filter(None, parts[1:]):  # within 100 columns
        if len(lines[-1]) + 1 + len(part) <= 100:
            lines[-1] += " " + part
        else:
            lines.append("  " + part)
    return "\n".join(lines)


def train_steps(args, run, resumed):
    """Train --steps steps, rank 0 printing `resumed`, then every --every-th step's row (and with --dispatch the first
    MoE layer's)."""
    cfg, comm, dp, ep, tp = run.cfg, run.comm, run.dp, run.ep, run.tp

    def report(r):
        while resumed:  # at the first step, once every rank's load succeeded: a refused resume says that alone
            print(resumed.pop(0))
        shown = r.step % args.every == 0 or r.step == args.steps - 1
        if comm.rank == 0 and shown:
            print(step_row(r, run.check))
        if args.dispatch and shown and run.moe_layers:
            everyone = gather_object(comm, r.dispatch)  # collective: every rank reports alike
            if comm.rank == 0:
                etp = args.etp if folded(args) else tp  # the experts' tp: the last mesh axis ("etp" where split)
                print("\n".join(dispatch_lines(everyone, run.moe_layers[0], comm.size, etp,
                                                tp_axis=stage_mesh(dp, ep, tp)[1][-1])))

    if pipelined(args):  # the dispatch pictures number the ranks on the whole (pp, dp, ep, tp) mesh
        return train_pipelined(cfg, comm, args.pp, dp, tp, args.steps, run.ids, sp=args.sp,
                               schedule=args.schedule, microbatches=microbatches(args),
                               virtual=virtual_stages(args), split=run.layers, check=run.check, on_step=report,
                               recompute=args.recompute, memory=args.memory, ep=ep,
                               algorithms=run.algorithms, zero=run.zero, precision=args.precision, kept=args.kept,
                               layouts=run.layouts, replay=args.replay, save=args.save,
                               save_every=args.save_every, resume=args.resume, cp=args.cp, context=context_of(args))
    return train(cfg, comm, dp, tp, args.steps, run.ids, sp=args.sp, check=run.check,
                 on_step=report, mesh=run.mesh, ep=ep, recompute=args.recompute, memory=args.memory,
                 replay=args.replay, zero=run.zero, precision=args.precision, kept=args.kept,
                 layouts=run.layouts, save=args.save, save_every=args.save_every, resume=args.resume,
                 cp=args.cp, context=context_of(args))


def report_results(args, run, results):
    """Print (rank 0) the check, the loss's trend and the experts' memory; whether all passed and the loss fell."""
    rank0 = run.comm.rank == 0
    if rank0 and args.save is not None:
        print(saved_line(args, run.comm.size))
    trend, falling = loss_trend([r.loss for r in results], first=first_loss(args.resume), lr=args.lr)
    failed = failed_steps(results)[0]  # (a few FP8 flips pass: docs/explanation/tolerances.md)
    if rank0 and (lines := check_lines(results, run.cfg, args.precision, run.check)):  # unchecked: its overflow
        print("\n".join(lines))
    if rank0:
        print(trend)
    mine = results[-1].experts if results else None
    if pipelined(args) and not dry_run_active() and args.memory:  # the first rank of each stage holding MoE layers
        everyone = gather_object(run.comm, mine) or []
        mine = [e for e in everyone if e and e.layers and e.rank % (run.dp * run.ep * run.tp) == 0]
    else:  # a dry run: each stage's representative adds its own
        mine = [mine] if mine and mine.layers else []
    ledger = [line for e in mine for line in e.lines()]
    if dry_run_active():
        note(*ledger)  # below the dry run's report: its own output is not shown
    elif args.memory and rank0:
        print("\n".join(results[-1].memory.lines() + ledger))
    return not failed and falling


# Simulated ranks with --ranks, else MPI; the command line refused before anything starts.
sys.exit(run_main(main, args, args.ranks, checks=lambda size: checked_run(args, size)))
