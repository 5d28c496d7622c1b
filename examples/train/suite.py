# SPDX-License-Identifier: MIT
"""Every training check in one command; writes a markdown summary, a JSON of
all results and the two-panel loss plot.

    python examples/train/suite.py --out /tmp/train [--plot docs/train_loss.png]
        [--parts parity,ckpt,scale] [--profile gpu|quick|cpu-smoke] [--budget-s S]
        [--launchers mp.spawn,torchrun]

Parts (each a few train.py processes, each with a timeout):
  parity   MXFP8 (row-only + a few bidirectional) vs BF16, DP=1, same data and
           seed; the MXFP8 run saves a checkpoint half-way and at the end, and
           exports the final model (safetensors)
  ckpt     resume DP=1 -> DP=1 (final checkpoint, exported model and loss bits
           identical to the uninterrupted run?), DP=1 -> DP=2, a DP=2 run saved
           half-way -> DP=2 (identical?) and -> DP=1; every DP=2 resume once
           per launcher (mp.spawn, torchrun); every load rebuilds the primaries
           from the masters and compares them byte for byte (the library)
  parity2  the parity pair again at DP=2
  scale    ~1B parameters, a few dozen steps: row-only vs bidirectional vs BF16:
           memory and the per-step time breakdown
DP=2 runs: NCCL with one GPU per rank, else gloo (ranks sharing one GPU, or the
CPU); each writes a per-rank collective trace (train.py --trace-collectives).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PROFILES = {
    # parity steps, checkpoint step, DP=2 run steps / checkpoint, scale config and steps, timeouts
    "gpu": dict(config="small", steps=300, save_at=150, dp2_steps=60, dp2_save=30, scale_config="1b",
                scale_steps=30, scale_args=["--lr", "3e-4"], t_run=180, t_scale=180),
    "quick": dict(config="small", steps=300, save_at=150, dp2_steps=40, dp2_save=20, scale_config="1b",
                  scale_steps=20, scale_args=["--lr", "3e-4"], t_run=120, t_scale=120),
    "cpu-smoke": dict(config="tiny", steps=12, save_at=6, dp2_steps=8, dp2_save=4, scale_config="tiny",
                      scale_steps=4, scale_args=["--d", "128"], t_run=240, t_scale=240),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/mxshard-train")
    p.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "train_loss.png"),
                   help="loss plot PNG (default: docs/train_loss.png of the repository; an SVG goes beside it)")
    p.add_argument("--parts", default="parity,ckpt,scale")
    p.add_argument("--profile", default="gpu", choices=sorted(PROFILES))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--steps", type=int, default=None, help="override the parity steps")
    p.add_argument("--scale-steps", type=int, default=None)
    p.add_argument("--scale-dp", type=int, default=1, help="data-parallel size of the scale runs")
    p.add_argument("--launchers", default="mp.spawn",
                   help="launchers of the DP=2 resumes: mp.spawn and/or torchrun (comma list)")
    p.add_argument("--ckpt-dir", default=None, help="where the checkpoints go (default: OUT/ckpt)")
    p.add_argument("--extra", default="", help="extra train.py arguments for every run (space separated)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: later runs get what is left, or are skipped")
    a = p.parse_args()
    P = dict(PROFILES[a.profile])
    if a.steps:
        P["steps"] = a.steps
        P["save_at"] = a.steps // 2
    if a.scale_steps:
        P["scale_steps"] = a.scale_steps
    launchers = [x for x in a.launchers.split(",") if x]
    for x in launchers:
        if x not in ("mp.spawn", "torchrun"):
            p.error(f"--launchers: {x!r} is not mp.spawn or torchrun")
    os.makedirs(a.out, exist_ok=True)
    ck = a.ckpt_dir or os.path.join(a.out, "ckpt")
    os.makedirs(ck, exist_ok=True)
    plot_path = a.plot
    parts = set(a.parts.split(","))
    extra = a.extra.split() + ["--device", a.device]
    R = {"profile": a.profile, "parts": sorted(parts), "launchers": launchers, "runs": {}, "checks": {},
         "errors": [], "env": {k: v for k, v in os.environ.items() if k.startswith(("MXS_", "NCCL_"))}}
    t_all = time.time()
    current = {"proc": None}

    def outputs():
        R["wall_s"] = time.time() - t_all
        with open(os.path.join(a.out, "train_results.json"), "w") as f:
            json.dump(R, f, indent=1)
        md = summary(R)
        with open(os.path.join(a.out, "train_summary.md"), "w") as f:
            f.write(md)
        return md

    def on_term(signum, frame):  # an outer timeout: end the running train.py (its own session) too
        pr = current["proc"]
        if pr is not None and pr.poll() is None:
            try:
                os.killpg(pr.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        R["errors"].append(f"suite killed by signal {signum}")
        outputs()
        sys.exit(1)
    signal.signal(signal.SIGTERM, on_term)

    def run(name, args, timeout, launcher="mp.spawn", dp=1):
        if a.budget_s is not None:
            left = a.budget_s - (time.time() - t_all)
            if left < 25:
                R["errors"].append(f"{name}: skipped (out of time budget)")
                outputs()
                return None
            timeout = min(timeout, left - 5)
        js = os.path.join(a.out, f"{name}.json")
        if os.path.exists(js):
            os.remove(js)
        train = os.path.join(HERE, "train.py")
        if dp > 1:
            args = args + ["--trace-collectives", os.path.join(a.out, "trace", name)]
        if launcher == "torchrun" and dp > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={dp}", train]
        else:
            cmd = [sys.executable, train] + (["--dp", str(dp)] if dp > 1 else [])
        cmd += ["--out-json", js] + args + extra
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        # own session: on a timeout the whole process group (spawned ranks included) is killed
        proc = subprocess.Popen(cmd, start_new_session=True)
        current["proc"] = proc
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            rc = "timeout"
        dt = time.time() - t0
        print(f"=== {name}: rc={rc} ({dt:.1f} s)", flush=True)
        res = None
        if rc == 0 and os.path.exists(js):
            res = json.load(open(js))
            res["wall_s"] = dt
            R["runs"][name] = res
        else:
            R["errors"].append(f"{name}: rc={rc} after {dt:.0f} s" +
                               (f" (collective traces: {os.path.join(a.out, 'trace', name)})" if dp > 1 else ""))
        outputs()
        return res

    def js(name):
        return os.path.join(a.out, f"{name}.json")

    def same(key, ref, name, k, ref_ckpt=None, ckpt=None, ref_exp=None, exp=None):
        """A resume at the same DP size against the uninterrupted run: final checkpoint,
        exported model, loss bits."""
        from compare import compare_ckpts, compare_files, compare_losses
        C = R["checks"]
        for kind, fn, x, y in (("ckpt", compare_ckpts, ref_ckpt, ckpt), ("export", compare_files, ref_exp, exp)):
            if x and y and not (os.path.exists(x) and os.path.exists(y)):
                C[f"{key}_{kind}"] = {"skipped": f"{x if not os.path.exists(x) else y} was not written"}
            elif x and y:
                try:
                    C[f"{key}_{kind}"] = fn(x, y)
                except Exception as e:  # noqa: BLE001 - reported
                    C[f"{key}_{kind}"] = {"identical": False, "error": repr(e)}
        C[f"{key}_losses"] = compare_losses(js(ref), js(name), k)

    def other(key, ref, name, k):
        from compare import compare_losses
        R["checks"][key] = compare_losses(js(ref), js(name), k)

    def make_plot():
        R["plot"] = {"path": plot_path, "writer": None}
        if "parity_mxfp8" not in R["runs"] or "parity_bf16" not in R["runs"]:
            return
        try:
            import plot
            mx = R["runs"]["parity_mxfp8"]
            runs = [("MXFP8 primaries (row-only + %d bidirectional), dp=1" % len(mx["bidir"]), _pts(mx)),
                    ("BF16 weights, dp=1", _pts(R["runs"]["parity_bf16"]))]
            if "resume_dp1_to_dp2" in R["runs"]:
                runs.append((f"MXFP8 resumed at step {P['save_at']} under dp=2", _pts(R["runs"]["resume_dp1_to_dp2"])))
            os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
            R["plot"]["writer"] = plot.plot(runs, mx["entropy_floor"], plot_path,
                                            "GPT %s on a Markov source: MXFP8 primaries vs BF16" % P["config"],
                                            diff_label="MXFP8 - BF16")
        except Exception as e:  # noqa: BLE001 - the summary still gets written
            R["errors"].append(f"plot: {e!r}")

    base = ["--config", P["config"], "--steps", str(P["steps"])]
    k = P["save_at"]
    ck_mx = os.path.join(ck, f"mxfp8-dp1-step{k}")
    fin_mx, exp_mx = os.path.join(ck, "parity-mx-final"), os.path.join(ck, "parity-mx.safetensors")

    if "parity" in parts or "ckpt" in parts:
        run("parity_mxfp8", base + ["--variant", "mxfp8", "--save-at", str(k), "--ckpt-dir", ck,
                                    "--save-final", fin_mx, "--export", exp_mx], P["t_run"])
    if "parity" in parts:
        run("parity_bf16", base + ["--variant", "bf16"], P["t_run"])
        make_plot()
    if "ckpt" in parts and "parity_mxfp8" in R["runs"]:
        fin, exp = os.path.join(ck, "resume-dp1-dp1-final"), os.path.join(ck, "resume-dp1-dp1.safetensors")
        if run("resume_dp1_to_dp1", base + ["--variant", "mxfp8", "--resume", ck_mx, "--save-final", fin,
                                            "--export", exp], P["t_run"]):
            same("same_dp1_resume", "parity_mxfp8", "resume_dp1_to_dp1", k, fin_mx, fin, exp_mx, exp)
        for L in launchers:
            name = "resume_dp1_to_dp2" + ("" if L == "mp.spawn" else "_torchrun")
            if run(name, base + ["--variant", "mxfp8", "--resume", ck_mx], P["t_run"], L, dp=2):
                other(f"other_dp_resume_1to2_losses{'' if L == 'mp.spawn' else '_torchrun'}", "parity_mxfp8", name, k)
    if "ckpt" in parts:
        b2 = ["--config", P["config"], "--steps", str(P["dp2_steps"]), "--variant", "mxfp8"]
        k2 = P["dp2_save"]
        ck2 = os.path.join(ck, f"mxfp8-dp2-step{k2}")
        fin2, exp2 = os.path.join(ck, "dp2-final"), os.path.join(ck, "dp2.safetensors")
        if run("dp2_run", b2 + ["--save-at", str(k2), "--ckpt-dir", ck, "--save-final", fin2, "--export", exp2],
               P["t_run"], launchers[0] if launchers else "mp.spawn", dp=2):
            for L in launchers:
                sfx = "" if L == "mp.spawn" else "_torchrun"
                fin, exp = os.path.join(ck, f"resume-dp2-dp2{sfx}-final"), os.path.join(ck, f"resume-dp2{sfx}.safetensors")
                if run("resume_dp2_to_dp2" + sfx, b2 + ["--resume", ck2, "--save-final", fin, "--export", exp],
                       P["t_run"], L, dp=2):
                    same("same_dp2_resume" + sfx, "dp2_run", "resume_dp2_to_dp2" + sfx, k2, fin2, fin, exp2, exp)
            if run("resume_dp2_to_dp1", b2 + ["--resume", ck2], P["t_run"]):
                other("other_dp_resume_2to1_losses", "dp2_run", "resume_dp2_to_dp1", k2)
    if "parity2" in parts:  # the parity pair again with sharded masters (DP=2)
        run("parity_mxfp8_dp2", base + ["--variant", "mxfp8"], P["t_run"], dp=2)
        run("parity_bf16_dp2", base + ["--variant", "bf16"], P["t_run"], dp=2)
    if "scale" in parts:
        sb = ["--config", P["scale_config"], "--steps", str(P["scale_steps"]), "--warmup", "5",
              "--log-every", "10", "--verify", "0", "--warm-steps", "5"] + P["scale_args"]
        run("scale_mx_rowonly", sb + ["--variant", "mxfp8", "--bidir", ""], P["t_scale"], dp=a.scale_dp)
        run("scale_mx_bidir", sb + ["--variant", "mxfp8", "--bidir", "*"], P["t_scale"], dp=a.scale_dp)
        run("scale_bf16", sb + ["--variant", "bf16"], P["t_scale"], dp=a.scale_dp)

    make_plot()
    md = outputs()
    print(md)
    return 1 if R["errors"] or not all_ok(R) else 0


def _pts(r):
    return [(s, v) for s, v, _ in r["losses"]]


def all_ok(R):
    ok = True
    for key, c in R["checks"].items():
        if key.startswith("same_") and key.endswith(("_ckpt", "_export")) and not (c.get("identical") or
                                                                                  c.get("skipped")):
            ok = False
        if key.startswith("same_") and key.endswith("_losses") and not c.get("bitwise_identical"):
            ok = False
    for r in R["runs"].values():
        for key in ("reload_check", "whole_tensor_check", "reload_whole_tensor_check"):
            if r.get(key) is not None and not r[key]["identical"]:
                ok = False
    return ok


def _ms(r, k):
    return r.get("timing_ms_median", {}).get(k, 0.0)


def _gb(x):
    return f"{x / 2**30:.2f}" if isinstance(x, (int, float)) else "-"


def summary(R):
    runs = R["runs"]
    L = ["# mxshard end-to-end training (examples/train on mxshard.torch)", ""]
    anyr = next(iter(runs.values()), None)
    if anyr:
        L.append(f"Device: {anyr['device_name']} ({anyr['device']}), torch {anyr['torch']}. GEMMs: {anyr['gemm']}. "
                 f"Profile `{R['profile']}`, DP=2 launchers {R['launchers']}, whole suite {R['wall_s']:.0f} s.")
        b2 = sorted({(r["backend"], r["device"].split(":")[0]) for r in runs.values() if r["dp"] > 1})
        if ("gloo", "cuda") in b2:
            L.append("DP=2 runs here shared one GPU over the gloo backend (gradients all-reduced + sliced, since gloo "
                     "has no reduce-scatter), so their collective times are not NCCL times.")
        if ("nccl", "cuda") in b2:
            L.append("DP=2 runs with the NCCL backend, one GPU per rank.")
        if ("gloo", "cpu") in b2:
            L.append("DP=2 runs on the CPU over gloo.")
    L.append("")
    mx, bf = runs.get("parity_mxfp8"), runs.get("parity_bf16")
    if mx and bf:
        floor = mx["entropy_floor"]
        gap_last = (mx["final_loss"] - bf["final_loss"]) / bf["final_loss"]
        gap_tail = (mx["final_loss_tail_mean"] - bf["final_loss_tail_mean"]) / bf["final_loss_tail_mean"]
        lm, lb = dict((x[0], x[1]) for x in mx["losses"]), dict((x[0], x[1]) for x in bf["losses"])
        d = [lm[s] - lb[s] for s in lm if s in lb]
        L += ["## Parity: MXFP8 primaries vs BF16 weights", "",
              f"Model `{mx['config']}` {mx['cfg']}, {mx['params']:,} parameters ({mx['n_mx']:,} in MXFP8 linears, "
              f"{mx['n_both']:,} of them bidirectional: {', '.join(mx['bidir']) or 'none'}), {mx['steps']} steps, "
              f"DP=1, seed {mx['seed']}, deterministic kernels {mx['deterministic']}, {mx['buckets']} bucket(s). "
              f"Entropy floor of the source: **{floor:.4f}** nats/token.", "",
              "| run | final loss (last step) | mean of last 10% steps | excess over floor |",
              "| --- | --- | --- | --- |",
              f"| MXFP8 | {mx['final_loss']:.4f} | {mx['final_loss_tail_mean']:.4f} | "
              f"{mx['final_loss_tail_mean'] - floor:.4f} |",
              f"| BF16 | {bf['final_loss']:.4f} | {bf['final_loss_tail_mean']:.4f} | "
              f"{bf['final_loss_tail_mean'] - floor:.4f} |", "",
              f"Relative gap (MXFP8 - BF16) / BF16: last step **{gap_last * 100:+.3f} %**, mean of the last 10% of "
              f"steps **{gap_tail * 100:+.3f} %** (target within 2 %: {'met' if abs(gap_tail) <= 0.02 else 'NOT met'}). "
              f"Per-step difference MXFP8 - BF16: mean {sum(d) / len(d):+.2e}, max |.| {max(abs(x) for x in d):.2e} "
              f"(the plot's lower panel).", "",
              "Loss by step: " + ", ".join(
                  f"{st}: {lm.get(st, float('nan')):.4f} / {lb.get(st, float('nan')):.4f}"
                  for st in sorted({0, *range(0, mx['steps'], max(1, mx['steps'] // 6)), mx['steps'] - 1}))
              + " (MXFP8 / BF16).", "",
              f"Plot: `{R.get('plot', {}).get('path')}` (writer: {R.get('plot', {}).get('writer')}).", ""]
    mx2, bf2 = runs.get("parity_mxfp8_dp2"), runs.get("parity_bf16_dp2")
    if mx2 and bf2:
        gap2 = (mx2["final_loss_tail_mean"] - bf2["final_loss_tail_mean"]) / bf2["final_loss_tail_mean"]
        L += ["### The same pair with sharded masters (DP=2)", "",
              "| run | final loss (last step) | mean of last 10% steps |", "| --- | --- | --- |",
              f"| MXFP8, dp=2 | {mx2['final_loss']:.4f} | {mx2['final_loss_tail_mean']:.4f} |",
              f"| BF16, dp=2 | {bf2['final_loss']:.4f} | {bf2['final_loss_tail_mean']:.4f} |", "",
              f"Relative gap of the last 10% of steps: **{gap2 * 100:+.3f} %**.", ""]
    L += ["## Per-step time breakdown (median ms, phases synchronized)", "",
          "fwd+bwd includes the gradient reductions the backward hooks launch; grad sync is the rest of them "
          "plus the norm all-reduce; writeback is the MXFP8 writeback (partial, MAX all-reduce, apply) and every "
          "all-gather (mxshard.torch.ShardedOptimizer.step, timed with the inner optimizer's step hooks).", "",
          "| run | launcher | fwd+bwd | grad sync | optimizer | writeback+gathers | step | writeback share |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in runs.items():
        if not r.get("timing_ms_median"):
            continue
        st = _ms(r, "step")
        L.append(f"| {name} ({r['variant']}, dp={r['dp']}) | {r.get('launcher')} | " +
                 " | ".join(f"{_ms(r, x):.2f}" for x in ("fwd_bwd", "grad_sync", "optim", "writeback", "step")) +
                 f" | {100 * _ms(r, 'writeback') / st if st else 0:.2f} % |")
    L += ["", "Collectives per step (counted at torch.distributed, DP=2 runs; the library's own count in brackets):"]
    for name, r in runs.items():
        if r.get("collectives_per_step_torch") and r["dp"] > 1:
            L.append(f"- {name}: {r['collectives_per_step_torch']} [{r.get('collectives_per_step_lib')}]")
    L += ["", "## Checkpoint, reload, resume", "",
          "Checkpoints are `mxshard.torch.save_checkpoint` directories (torch.distributed.checkpoint: each rank "
          "writes its shard of the FP32 masters and AdamW state; the MXFP8 primaries, dense parameters, step "
          "counters and the loop's position once); `load_checkpoint` reshards under any DP size, rebuilds the "
          "primaries from the masters and compares them byte for byte with the saved ones (raising on a "
          "mismatch). The exported model is `export_safetensors`.", "",
          "| check | result |", "| --- | --- |"]
    for name, r in runs.items():
        if "reload_check" in r:
            L.append(f"| {name}: load under dp={r['dp']} ({r.get('launcher')}; saved under dp="
                     f"{r['resumed_from'].get('saved_dp')}), primaries rebuilt and compared by load_checkpoint | "
                     f"{'byte-identical' if r['reload_check']['identical'] else 'DIFFERENT'} |")
    for name, r in runs.items():
        for key, what in (("whole_tensor_check", "end of run"), ("reload_whole_tensor_check", "after reload")):
            if key in r:
                c = r[key]
                rel = c.get("weight_rel_rms_err")
                L.append(f"| {name}: weights vs the gathered masters ({what}) | "
                         f"{'identical' if c['identical'] else 'DIFFERENT: %d + %d bytes' % (c['mismatched_bytes'], c['dense_mismatched_bytes'])} "
                         f"({c['planes']} MXFP8 planes, {c['dense_params']} dense params" +
                         (f"; MXFP8 vs FP32 master relative RMS error {rel:.2e}" if rel is not None else "") + ") |")
    C = R["checks"]
    for key in sorted(C):
        c = C[key]
        if key.startswith("same_"):
            what = key.replace("same_", "").replace("_", " ")
            if c.get("skipped"):
                L.append(f"| {what} | skipped: {c['skipped']} |")
            elif key.endswith("_ckpt"):
                res = ("identical (%d tensors, %s bytes)" % (c["tensors"], f"{c['bytes']:,}") if c.get("identical")
                       else "DIFFERS: %s" % {x: c.get(x) for x in ("differing", "other_differing", "missing", "error")})
                L.append(f"| {what}: final checkpoint vs the uninterrupted run's | {res} |")
            elif key.endswith("_export"):
                res = (f"identical ({c['tensors']} tensors, {c['data_bytes']:,} data bytes; whole file byte-identical: "
                       f"{c['file_bytes_identical']})" if c.get("identical") else f"DIFFERS: {c}")
                L.append(f"| {what}: exported safetensors vs the uninterrupted run's | {res} |")
            elif c.get("steps"):
                L.append(f"| {what} (steps {c['first']}..{c['last']}) | "
                         f"{'bitwise identical' if c['bitwise_identical'] else 'DIFFERS: %d of %d steps equal, max |diff| %.2e' % (c['bitwise_equal_steps'], c['steps'], c['max_abs_diff'])} |")
        elif key.startswith("other_") and c.get("steps"):
            L.append(f"| {key.replace('_', ' ')} (steps {c['first']}..{c['last']}) | max |diff| {c['max_abs_diff']:.2e}, "
                     f"mean |diff| {c['mean_abs_diff']:.2e}, final rel diff {c['final_rel_diff']:+.2e} |")
    sc = [(n, runs[n]) for n in ("scale_mx_rowonly", "scale_mx_bidir", "scale_bf16") if n in runs]
    if sc:
        r0 = sc[0][1]
        L += ["", "## Scale run", "",
              f"Config `{r0['config']}` {r0['cfg']}: {r0['params']:,} parameters, DP={r0['dp']}, {r0['steps']} steps, "
              f"{r0['buckets']} buckets (timings: median over steps after the first 5). Memory per rank; AdamW's "
              f"state is allocated at the first step.", "",
              "| variant | weight storage (GiB) | after setup (GiB) | after step 1 (GiB) | peak in training (GiB) | "
              "step (ms) | writeback+gathers (ms) | share |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n, r in sc:
            bb = r.get("buffer_bytes", {})
            st, wb = _ms(r, "step"), _ms(r, "writeback")
            L.append(f"| {n} | {_gb(bb.get('weights'))} | {_gb(r.get('mem_after_setup'))} | "
                     f"{_gb(r.get('mem_after_first_step'))} | {_gb(r.get('peak_mem_train'))} | {st:.1f} | {wb:.2f} | "
                     f"{100 * wb / st if st else 0:.2f} % |")
        L += ["", "Buffers (bytes, this rank) of each scale run:", ""]
        for n, r in sc:
            L.append(f"- {n}: {r.get('buffer_bytes')}")
    if R["errors"]:
        L += ["", "## Errors", ""] + [f"- {e}" for e in R["errors"]]
    L += ["", f"Overall: {'PASS' if all_ok(R) and not R['errors'] else 'FAIL'}", ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
