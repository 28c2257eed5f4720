//! SWE-bench instances in real pods (`tasks.swebench`, docs/swebench.md): an instance's own
//! image (the repository at its base commit in `/testbed`, its later history kept, as the public
//! images keep it), a pod per session from the job's `poolTemplate`, the seed step, the grading
//! sidecar with the `swebench` package, and the instance's eval script run at `/testbed` in the
//! grader container. An agent that fixes the bug (after finding no trace of either patch where
//! it can look) resolves; one that does nothing scores 0; an instance whose `PASS_TO_PASS` fails
//! on its untouched repository is infrastructure, its fix never scored. The eval scripts
//! install the repository into the image's root-owned environment before the tests, as
//! Django 1.x's `setup.py install` does: the grader runs them as root, as swebench does, or the
//! tests would import the image's copy and the fix would score 0.

use super::*;
use floe_tests::swebench_instance::{self as swe, GOLD_PATCH_MARKER, TEST_PATCH_MARKER};

/// One honest call, then the behaviour the problem statement's last line names. The fix is
/// written only when neither patch can be found: a leak costs the reward.
const AGENT: &str = r#"
import json, os, subprocess, urllib.error, urllib.request
body = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                             data=json.dumps(body).encode(),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
urllib.request.urlopen(req, timeout=120).read()
behaviour = os.environ["FLOE_INSTRUCTION"].strip().splitlines()[-1].split("agent: ")[1]
# Reversed here, so that this file is not itself a find.
leaks = [m for m in ("MARK_TEST"[::-1], "MARK_GOLD"[::-1])
         if subprocess.run(["sh", "-c", "grep -rqs %s / --exclude-dir=proc --exclude-dir=sys; r=$?; "
                            "git log --all -p | grep -q %s || exit $r" % (m, m)]).returncode == 0]
# The grading sidecar shares this pod's loopback: it must answer nothing without the token.
try:
    urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8391/", data=b"{}"), timeout=10)
    leaks.append("the bridge answered")
except urllib.error.HTTPError as e:
    if e.code != 401:
        leaks.append("the bridge said %d" % e.code)
except Exception as e:
    leaks.append("the bridge: %r" % e)
print("cwd", os.getcwd(), "leaks", leaks, flush=True)
if behaviour == "fix" and not leaks and "return a - b" in open("calc.py").read():
    open("calc.py", "w").write(FIXED)
# The fix, and the PASS_TO_PASS test it breaks told to expect its failure (swebench counts an
# XFAIL kept): the baseline, run first in a pod, has it passing.
if behaviour == "xfail-p2p" and not leaks:
    open("calc.py", "w").write(FIXED + "\n\ndef sub(a, b):\n    import pytest\n    pytest.xfail('x')\n")
"#;

/// The eval script's install into the image's environment (`/opt/site`, root's, holding the
/// base commit's `calc.py`: `swebench-images.sh`), which the tests then import from, not from
/// the evaluation copy (`PYTHONSAFEPATH`: not from the working directory).
const REINSTALL: &str =
    "cp calc.py /opt/site/calc.py\nexport PYTHONPATH=/opt/site PYTHONSAFEPATH=1\n";

#[tokio::test]
async fn swebench_instances_run_in_their_own_image_and_are_graded_by_swebench() -> Result<()> {
    let work = prepare("swebench").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let install = swe::install_dir()?;
    // The upstream repository, checked out at the base commit as the public images are.
    let repos = tempfile::tempdir()?;
    let up = swe::upstream(&repos.path().join("calc"))?;
    let git = std::process::Command::new("git")
        .args(["-C"])
        .arg(&up.checkout)
        .args(["checkout", "-q", &up.base_commit])
        .status()?;
    anyhow::ensure!(git.success(), "git checkout");
    let out = std::process::Command::new(
        floe_tests::workspace_root().join("scripts/kube-test-cluster/swebench-images.sh"),
    )
    .arg(&n.dir)
    .arg(&install)
    .arg("acme_1776_calc-1")
    .arg(&up.checkout)
    .output()?;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image = |key: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
            .with_context(|| format!("no {key}= in {printed}"))
    };
    let (grader, instance) = (image("grader")?, image("instance")?);
    let activate = std::path::Path::new("/opt/miniconda3/bin/activate");
    let lines: Vec<String> = [(1, "fix"), (2, "nothing"), (3, "fix"), (4, "xfail-p2p")]
        .iter()
        .map(|(k, behaviour)| {
            let statement =
                format!("calc.add(2, 3) returns -1; it should return 5.\nagent: {behaviour}\n");
            let mut line = swe::instance(&up, *k, &statement, activate);
            line["image"] = instance.clone().into();
            let script = line["eval_script"].as_str().unwrap_or_default().replacen(
                "cd /testbed\n",
                &format!("cd /testbed\n{REINSTALL}"),
                1,
            );
            line["eval_script"] = script.into();
            if *k == 3 {
                // A PASS_TO_PASS test this environment never passes (as one that needs the
                // network): every session of the instance would score 0.
                line["PASS_TO_PASS"] =
                    json!([swe::PASS_TO_PASS, "tests/test_calc.py::test_online"]);
            }
            line.to_string()
        })
        .collect();
    let agent = AGENT
        .replace(
            "MARK_TEST",
            &TEST_PATCH_MARKER.chars().rev().collect::<String>(),
        )
        .replace(
            "MARK_GOLD",
            &GOLD_PATCH_MARKER.chars().rev().collect::<String>(),
        )
        .replace("FIXED", &format!("{:?}", swe::FIXED_CALC));
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "instances"},
               "data": {"instances.jsonl": lines.join("\n")}}),
    )
    .await?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "swe-agent"},
               "data": {"agent.py": agent}}),
    )
    .await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
               "metadata": {"name": "swe"},
               "spec": {"numSamples": 1, "concurrency": 2, "backoffLimit": 0,
                        "poolTemplate": agent_template(&instance, "swe-agent"),
                        "harness": {"preset": "custom", "command": ["python3", "/opt/agent/agent.py"]},
                        "tasks": {"configMap": {"name": "instances", "key": "instances.jsonl"},
                                  "swebench": {"graderImage": grader}},
                        "evaluator": {"reward": {"source": "SWEBench"}},
                        "sampling": {"maxResponseTokens": 16},
                        "timeouts": {"agentSeconds": 120, "evaluatorSeconds": 120},
                        "sft": {"upstream": {"url": format!("http://teacher.{ns}.svc:8000"), "model": "policy"},
                                "output": {"claimName": "data", "path": "/swe"}, "minReward": 0}}}),
    )
    .await?;
    let status = finished(n, &client, &ns, "swe").await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    // Events are published beside the status write, not before it.
    let failed = eventually_within(60, "a SessionFailed event", async || {
        let notes: Vec<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("SessionFailed"))
            .filter_map(|e| e.note)
            .collect();
        Ok((!notes.is_empty()).then_some(notes))
    })
    .await
    .unwrap_or_default();
    assert_eq!(
        (status.sessions.succeeded, status.sessions.failed),
        (3, 1),
        "three scored, the unfit instance failed: {status:?}\n{failed:?}"
    );
    assert!(
        failed.len() == 1
            // The third task, acme__calc-3.
            && failed[0].starts_with("session 2 ")
            && failed[0].contains("PASS_TO_PASS tests fail on its untouched repository")
            && failed[0].contains("test_online"),
        "{failed:?}"
    );
    let lines = dataset(&work.data.path().join("swe"), 3).await?;
    for (id, reward) in [
        ("acme__calc-1", 1.0),
        ("acme__calc-2", 0.0),
        ("acme__calc-4", 0.0),
    ] {
        let t = lines
            .iter()
            .find(|t| t["session"] == format!("swe-{id}-0").as_str())
            .with_context(|| format!("no trajectory for {id}: {lines:?}"))?;
        assert_eq!(
            t["reward"].as_f64(),
            Some(reward),
            "{id}: {}",
            t["evaluation"]
        );
        assert_eq!(
            t["evaluation"]["detail"]["swebench"]["version"], "5.0.2",
            "{id}"
        );
        if id == "acme__calc-4" {
            assert_eq!(
                t["evaluation"]["detail"]["swebench"]["pass_to_pass_regressed"],
                json!([swe::PASS_TO_PASS]),
                "{id}: {}",
                t["evaluation"]
            );
        }
    }
    Ok(())
}
