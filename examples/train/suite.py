# SPDX-License-Identifier: MIT
"""Every training check of issue 12 in one command; writes a markdown summary,
a JSON of all results and the loss plot.

    python examples/train/suite.py --out /tmp/train [--plot docs/train_loss.png]
        [--parts parity,ckpt,scale] [--profile gpu|cpu-smoke] [--budget-s S]

Parts (each a few train.py processes, each with a timeout):
  parity  MXFP8 (row-only + a few bidirectional) vs BF16, DP=1, same data/seed;
          the MXFP8 run saves a checkpoint half-way and at the end
  ckpt    reload + resume: DP=1 -> DP=1 (byte-identical continuation?),
          DP=1 -> DP=2, and a DP=2 run saved half-way -> DP=2 (byte-identical?)
          and -> DP=1; every reload compares the written-back primaries with the
          saved ones byte for byte
  scale   ~1B parameters, DP=1, a few dozen steps: row-only vs bidirectional vs
          BF16: peak memory and the per-step time breakdown
DP=2 runs use the gloo backend when the ranks share one GPU (nccl needs one
GPU per rank).
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
    # parity steps, ckpt-at, dp2 run steps, scale steps, configs
    "gpu": dict(config="small", steps=300, save_at=150, dp2_steps=60, dp2_save=30, scale_config="1b",
                scale_steps=30, scale_args=["--lr", "3e-4"], t_run=150, t_scale=150),
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
    os.makedirs(a.out, exist_ok=True)
    ck = os.path.join(a.out, "ckpt")
    os.makedirs(ck, exist_ok=True)
    plot_path = a.plot
    parts = set(a.parts.split(","))
    extra = a.extra.split() + ["--device", a.device]
    R = {"profile": a.profile, "parts": sorted(parts), "runs": {}, "checks": {}, "errors": []}
    t_all = time.time()
    current = {"proc": None}

    def outputs():
        R["wall_s"] = time.time() - t_all
        with open(os.path.join(a.out, "train_results.json"), "w") as f:
            json.dump(R, f, indent=1)
        md = summary(R, P, P["save_at"])
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

    def run(name, args, timeout):
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
        cmd = [sys.executable, os.path.join(HERE, "train.py"), "--out-json", js] + args + extra
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
            R["errors"].append(f"{name}: rc={rc}")
        outputs()
        return res

    def make_plot():
        """The loss plot (again after the resume runs, which add a curve)."""
        R["plot"] = {"path": plot_path, "writer": None}
        if "parity_mxfp8" not in R["runs"] or "parity_bf16" not in R["runs"]:
            return
        try:
            import plot
            runs = [("MXFP8 primaries (row-only + %d bidirectional), dp=1" %
                     len(R["runs"]["parity_mxfp8"]["bidir"]), _pts(R["runs"]["parity_mxfp8"])),
                    ("BF16 weights, dp=1", _pts(R["runs"]["parity_bf16"]))]
            if "resume_dp1_to_dp2" in R["runs"]:
                runs.append((f"MXFP8 resumed at step {k} under dp=2", _pts(R["runs"]["resume_dp1_to_dp2"])))
            os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
            R["plot"]["writer"] = plot.plot(runs, R["runs"]["parity_mxfp8"]["entropy_floor"], plot_path,
                                            "GPT %s on a Markov source: MXFP8 primaries vs BF16" % P["config"])
        except Exception as e:  # noqa: BLE001 - the summary still gets written
            R["errors"].append(f"plot: {e!r}")

    base = ["--config", P["config"], "--steps", str(P["steps"])]
    k = P["save_at"]
    ck_mx = os.path.join(ck, f"mxfp8-dp1-step{k}.safetensors")
    fin_mx = os.path.join(ck, "parity-mx-final.safetensors")
    from compare import compare_ckpts, compare_losses

    if "parity" in parts or "ckpt" in parts:
        run("parity_mxfp8", base + ["--variant", "mxfp8", "--save-at", str(k), "--ckpt-dir", ck,
                                    "--save-final", fin_mx], P["t_run"])
    if "parity" in parts:
        run("parity_bf16", base + ["--variant", "bf16"], P["t_run"])
        make_plot()
    if "ckpt" in parts and "parity_mxfp8" in R["runs"]:
        fin = os.path.join(ck, "resume-dp1-dp1-final.safetensors")
        r = run("resume_dp1_to_dp1", base + ["--variant", "mxfp8", "--resume", ck_mx, "--save-final", fin],
                P["t_run"])
        if r:
            R["checks"]["same_dp1_resume_ckpt"] = compare_ckpts(fin_mx, fin)
            R["checks"]["same_dp1_resume_losses"] = compare_losses(
                os.path.join(a.out, "parity_mxfp8.json"), os.path.join(a.out, "resume_dp1_to_dp1.json"), k)
        r = run("resume_dp1_to_dp2", base + ["--variant", "mxfp8", "--dp", "2", "--resume", ck_mx], P["t_run"])
        if r:
            R["checks"]["other_dp_resume_1to2_losses"] = compare_losses(
                os.path.join(a.out, "parity_mxfp8.json"), os.path.join(a.out, "resume_dp1_to_dp2.json"), k)
    if "ckpt" in parts:
        b2 = ["--config", P["config"], "--steps", str(P["dp2_steps"]), "--variant", "mxfp8"]
        k2 = P["dp2_save"]
        ck2 = os.path.join(ck, f"mxfp8-dp2-step{k2}.safetensors")
        fin2 = os.path.join(ck, "dp2-final.safetensors")
        r = run("dp2_run", b2 + ["--dp", "2", "--save-at", str(k2), "--ckpt-dir", ck, "--save-final", fin2],
                P["t_run"])
        if r:
            fin = os.path.join(ck, "resume-dp2-dp2-final.safetensors")
            if run("resume_dp2_to_dp2", b2 + ["--dp", "2", "--resume", ck2, "--save-final", fin], P["t_run"]):
                R["checks"]["same_dp2_resume_ckpt"] = compare_ckpts(fin2, fin)
                R["checks"]["same_dp2_resume_losses"] = compare_losses(
                    os.path.join(a.out, "dp2_run.json"), os.path.join(a.out, "resume_dp2_to_dp2.json"), k2)
            if run("resume_dp2_to_dp1", b2 + ["--dp", "1", "--resume", ck2], P["t_run"]):
                R["checks"]["other_dp_resume_2to1_losses"] = compare_losses(
                    os.path.join(a.out, "dp2_run.json"), os.path.join(a.out, "resume_dp2_to_dp1.json"), k2)
    if "parity2" in parts:  # the parity pair again with sharded masters (DP=2)
        run("parity_mxfp8_dp2", base + ["--variant", "mxfp8", "--dp", "2"], P["t_run"])
        run("parity_bf16_dp2", base + ["--variant", "bf16", "--dp", "2"], P["t_run"])
    if "scale" in parts:
        sb = ["--config", P["scale_config"], "--steps", str(P["scale_steps"]), "--warmup", "5",
              "--log-every", "10", "--verify", "0", "--warm-steps", "5", "--dp", str(a.scale_dp)] + P["scale_args"]
        run("scale_mx_rowonly", sb + ["--variant", "mxfp8", "--bidir", ""], P["t_scale"])
        run("scale_mx_bidir", sb + ["--variant", "mxfp8", "--bidir", "*"], P["t_scale"])
        run("scale_bf16", sb + ["--variant", "bf16"], P["t_scale"])

    make_plot()
    md = outputs()
    print(md)
    return 1 if R["errors"] or not all_ok(R) else 0


def _pts(r):
    return [(s, v) for s, v, _ in r["losses"]]


def all_ok(R):
    ok = True
    for k, c in R["checks"].items():
        if k.startswith("same_") and k.endswith("_ckpt") and not c.get("identical"):
            ok = False
    for name, r in R["runs"].items():
        if "reload_check" in r and not r["reload_check"]["identical"]:
            ok = False
        for key in ("whole_tensor_check", "reload_whole_tensor_check", "dequant_check"):
            if r.get(key) is not None and not r[key]["identical"]:
                ok = False
    return ok


def _ms(r, k):
    return r.get("timing_ms_median", {}).get(k, 0.0)


def _gb(x):
    return f"{x / 2**30:.2f}" if isinstance(x, (int, float)) else "-"


def summary(R, P, k):
    runs = R["runs"]
    L = ["# mxshard end-to-end training (issue 12)", ""]
    anyr = next(iter(runs.values()), None)
    if anyr:
        L.append(f"Device: {anyr['device_name']} ({anyr['device']}), torch {anyr['torch']}. "
                 f"GEMMs: {anyr['gemm']}. Profile `{R['profile']}`, whole suite {R['wall_s']:.0f} s.")
        b2 = sorted({(r["backend"], r["device"].split(":")[0]) for r in runs.values() if r["dp"] > 1})
        if ("gloo", "cuda") in b2:
            L.append("DP=2 runs here shared one GPU over the gloo backend (gradients all-reduced + sliced, "
                     "since gloo has no reduce-scatter; collectives staged through host memory), so their "
                     "collective times are not NCCL times.")
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
        L += ["## Parity: MXFP8 primaries vs BF16 weights", "",
              f"Model `{mx['config']}` {mx['cfg']}, {mx['params']:,} parameters ({mx['n_mx']:,} in MXFP8 "
              f"linears, {mx['n_both']:,} of them bidirectional: {', '.join(mx['bidir']) or 'none'}), "
              f"{mx['steps']} steps, DP=1, seed {mx['seed']}, deterministic kernels {mx['deterministic']}. "
              f"Entropy floor of the source: **{floor:.4f}** nats/token.", "",
              "| run | final loss (last step) | mean of last 10% steps | excess over floor |",
              "| --- | --- | --- | --- |",
              f"| MXFP8 | {mx['final_loss']:.4f} | {mx['final_loss_tail_mean']:.4f} | "
              f"{mx['final_loss_tail_mean'] - floor:.4f} |",
              f"| BF16 | {bf['final_loss']:.4f} | {bf['final_loss_tail_mean']:.4f} | "
              f"{bf['final_loss_tail_mean'] - floor:.4f} |", "",
              f"Relative gap (MXFP8 - BF16) / BF16: last step **{gap_last * 100:+.3f} %**, mean of the last 10% "
              f"of steps **{gap_tail * 100:+.3f} %** (target within 2 %: "
              f"{'met' if abs(gap_tail) <= 0.02 else 'NOT met'}).", "",
              "Loss by step: " + ", ".join(
                  f"{st}: {dict((x[0], x[1]) for x in mx['losses']).get(st, float('nan')):.4f} / "
                  f"{dict((x[0], x[1]) for x in bf['losses']).get(st, float('nan')):.4f}"
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
              f"Relative gap of the last 10% of steps: **{gap2 * 100:+.3f} %** (target within 2 %: "
              f"{'met' if abs(gap2) <= 0.02 else 'NOT met'}).", ""]
    L += ["## Per-step time breakdown (median ms, phases synchronized)", "",
          "| run | fwd+bwd | grad sync | optimizer | wb partial | wb reduce | wb apply | gather | step | "
          "writeback+gather share |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in runs.items():
        if not r.get("timing_ms_median"):
            continue
        wbg = sum(_ms(r, x) for x in ("wb_partial", "wb_reduce", "wb_apply", "gather"))
        st = _ms(r, "step")
        L.append(f"| {name} ({r['variant']}, dp={r['dp']}) | " +
                 " | ".join(f"{_ms(r, x):.2f}" for x in ("fwd_bwd", "grad_sync", "optim", "wb_partial",
                                                         "wb_reduce", "wb_apply", "gather", "step")) +
                 f" | {100 * wbg / st if st else 0:.2f} % |")
    L += ["", "Collectives per step (counted at torch.distributed, DP=2 runs): "]
    for name, r in runs.items():
        if r.get("collectives_per_step_torch"):
            c = {k2: v for k2, v in r["collectives_per_step_torch"].items() if v}
            L.append(f"- {name}: {c}")
    mxc = [r for r in runs.values() if r["variant"] == "mxfp8" and r.get("collectives_per_step_comm")]
    if mxc:
        L.append(f"- writeback exponent reductions per step (every MXFP8 run): "
                 f"{sorted(set(r['collectives_per_step_comm'].get('all_reduce_max_u8', 0) for r in mxc))} "
                 "(one bucket, one uint8 MAX all-reduce)")
    L += ["", "## Checkpoint, reload, resume", "",
          "Checkpoints are safetensors files: full FP32 master, Adam m and v, MXFP8 primaries (F8_E4M3 data, "
          "U8 scales), the bf16 weights, metadata (parameter table, step, optimizer and format settings).", "",
          "| check | result |", "| --- | --- |"]
    for name, r in runs.items():
        if "reload_check" in r:
            c = r["reload_check"]
            L.append(f"| {name}: reload under dp={r['dp']} (saved under dp={r['resumed_from']['saved_dp']}), "
                     f"write back, compare {c['planes']} weight tensors ({c['bytes']:,} bytes) with the saved ones "
                     f"| {'byte-identical' if c['identical'] else 'DIFFERENT: %d bytes' % c['mismatched_bytes']} |")
    for name, r in runs.items():
        for key, what in (("whole_tensor_check", "end of run"), ("reload_whole_tensor_check", "after reload")):
            if key in r:
                c = r[key]
                rel = c.get("weight_rel_rms_err")
                L.append(f"| {name}: primaries vs whole-tensor quantize of the gathered master ({what}) | "
                         f"{'identical' if c['identical'] else 'DIFFERENT: %d bytes' % c['mismatched_bytes']} "
                         f"({c['planes']} planes" + (f"; MXFP8 vs FP32 master relative RMS error {rel:.2e}"
                                                      if rel is not None else "") + ") |")
    for name, r in runs.items():
        c = r.get("dequant_check")
        if c is not None and (name == "parity_mxfp8" or not c["identical"]):
            L.append(f"| {name}: mxshard.dequantize (bf16) vs a torch decode of the same bytes | "
                     + ("bit-identical (%d planes)" % c["planes"] if c["identical"] else
                        "DIFFERENT: %s" % c) + " |")
    C = R["checks"]
    for key, what in (("same_dp1_resume_ckpt", "dp=1 -> dp=1 resume: final checkpoint vs uninterrupted run"),
                      ("same_dp2_resume_ckpt", "dp=2 -> dp=2 resume: final checkpoint vs uninterrupted run")):
        if key in C:
            c = C[key]
            L.append(f"| {what} | {'byte-identical' if c['identical'] else 'differs in %d tensors %s' % (c['n_differing'], c['differing'][:6])} |")
    for key, what in (("same_dp1_resume_losses", "dp=1 -> dp=1 resume: losses"),
                      ("same_dp2_resume_losses", "dp=2 -> dp=2 resume: losses"),
                      ("other_dp_resume_1to2_losses", "dp=1 checkpoint resumed under dp=2: losses vs dp=1 run"),
                      ("other_dp_resume_2to1_losses", "dp=2 checkpoint resumed under dp=1: losses vs dp=2 run")):
        if key in C and C[key].get("steps"):
            c = C[key]
            L.append(f"| {what} (steps {c['first']}..{c['last']}) | "
                     f"{'bitwise identical' if c['bitwise_identical'] else 'max |diff| %.2e, mean |diff| %.2e, final rel diff %+.2e' % (c['max_abs_diff'], c['mean_abs_diff'], c['final_rel_diff'])} |")
    sc = [(n, runs[n]) for n in ("scale_mx_rowonly", "scale_mx_bidir", "scale_bf16") if n in runs]
    if sc:
        r0 = sc[0][1]
        L += ["", "## Scale run", "",
              f"Config `{r0['config']}` {r0['cfg']}: {r0['params']:,} parameters, DP=1, {r0['steps']} steps "
              f"(timings: median over steps after the first 5).", "",
              "| variant | weight storage (GiB) | memory after setup (GiB) | peak allocated in training (GiB) | "
              "step (ms) | writeback (ms) | gather (ms) | writeback+gather share |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n, r in sc:
            bb = r.get("buffer_bytes", {})
            wbytes = sum(v for kk, v in bb.items() if kk.startswith("weights"))
            wb = sum(_ms(r, x) for x in ("wb_partial", "wb_reduce", "wb_apply"))
            g = _ms(r, "gather")
            st = _ms(r, "step")
            L.append(f"| {n} | {_gb(wbytes)} | {_gb(r.get('mem_after_setup'))} | {_gb(r.get('peak_mem_train'))} | "
                     f"{st:.1f} | {wb:.2f} | {g:.2f} | {100 * (wb + g) / st if st else 0:.2f} % |")
        L += ["", "Buffers (bytes) of each scale run:", ""]
        for n, r in sc:
            L.append(f"- {n}: {r.get('buffer_bytes')}")
        L.append("At DP=1 the gather moves nothing (one rank owns everything) and the reduce is a no-op; "
                 "the writeback time is partial + apply (+ the bf16 cast of the dense parameters).")
    if R["errors"]:
        L += ["", "## Errors", ""] + [f"- {e}" for e in R["errors"]]
    L += ["", f"Overall: {'PASS' if all_ok(R) and not R['errors'] else 'FAIL'}", ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
