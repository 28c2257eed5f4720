use serde_json::json;

use super::*;
use crate::rollout_job::TaskSource;
use crate::task_file::{parse_source, TaskFileError};

const TEST_PATCH: &str = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n\
--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1,2 @@\n x\n+y\n\
diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n\
--- /dev/null\n+++ b/tests/test_new.py\n@@ -0,0 +1 @@\n+z\n";

fn instance() -> serde_json::Value {
    json!({
        "instance_id": "acme__calc-12",
        "repo": "acme/calc",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "add() subtracts",
        "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n",
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": "[\"tests/test_calc.py::test_add\"]",
        "PASS_TO_PASS": ["tests/test_calc.py::test_sub"],
        "version": 1.0,
        "eval_script": "#!/bin/bash\ncd /testbed\ngit apply -v - <<'EOF_1'\n/testbed\nEOF_1\npytest -rA\n",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "hints_text": "",
        "created_at": "2024-01-01"
    })
}

fn swebench_source() -> TaskSource {
    TaskSource {
        file: Some(crate::rollout_job::FileTasks {
            path: "instances.jsonl".into(),
            claim_name: None,
        }),
        swebench: Some(SweBenchTasks::default()),
        ..Default::default()
    }
}

#[test]
fn an_instance_becomes_a_task_whose_agent_sees_neither_patch() {
    let task = to_task(instance(), &SweBenchTasks::default(), Checkouts::Image).expect("task");
    assert_eq!(task.id, "acme__calc-12");
    assert_eq!(task.instruction, "add() subtracts");
    assert_eq!(
        task.image.as_deref(),
        Some("swebench/sweb.eval.x86_64.acme_1776_calc-12:latest")
    );
    let repository = task.repository.clone().expect("repository");
    assert_eq!(repository.path, "/testbed");
    assert_eq!(
        repository.commit,
        "0123456789abcdef0123456789abcdef01234567"
    );
    assert!(task.files.is_empty() && task.prepare.is_empty());
    let evaluation = task.evaluation.clone().expect("evaluation");
    assert_eq!(
        evaluation.hidden_files.keys().collect::<Vec<_>>(),
        [EVAL_SCRIPT]
    );
    let grading = evaluation.swebench.expect("grading");
    assert_eq!(grading.fail_to_pass, ["tests/test_calc.py::test_add"]);
    assert_eq!(grading.pass_to_pass, ["tests/test_calc.py::test_sub"]);
    assert_eq!(grading.version, "1.0");
    assert_eq!(grading.log_parser, "parse_log_pytest");
    // The test patch's files and git are the grader's.
    assert_eq!(
        evaluation.protected_paths,
        ["tests/test_calc.py", "tests/test_new.py", ".git/**"]
    );
    // The gold patch is nowhere in the task; the test patch only in what the grader holds.
    let mut agent_side = task.clone();
    agent_side.evaluation = None;
    let text = serde_json::to_string(&agent_side).expect("json");
    assert!(!text.contains("calc.py\\n--- a/calc.py"), "{text}");
    assert!(!serde_json::to_string(&task)
        .expect("json")
        .contains("--- a/calc.py"));
    assert!(!text.contains("test_new.py"), "{text}");
}

#[test]
fn local_checkouts_and_per_line_images_follow_the_settings() {
    let settings = SweBenchTasks {
        local_checkouts: "checkouts/{name}".into(),
        ..Default::default()
    };
    let mut line = instance();
    line["image"] = json!("registry.local/calc:12");
    let task = to_task(line, &settings, Checkouts::Local).expect("task");
    assert_eq!(task.repository.expect("repo").path, "checkouts/calc");
    assert_eq!(task.image.as_deref(), Some("registry.local/calc:12"));
    assert_eq!(
        docker_id("Django__Django-11099"),
        "django_1776_django-11099"
    );
}

#[test]
fn a_malformed_instance_is_refused_with_its_line_and_id() {
    let err = |line: serde_json::Value| {
        let text = format!("{}\n{}\n", instance(), line);
        parse_source(&text, &swebench_source(), Checkouts::Image)
            .map(|t| t.len())
            .map_err(|e| e.to_string())
    };
    let mut no_script = instance();
    no_script["instance_id"] = json!("acme__calc-13");
    no_script
        .as_object_mut()
        .expect("object")
        .remove("eval_script");
    assert!(err(no_script)
        .is_err_and(|e| e.starts_with("line 2 (instance acme__calc-13): eval_script is missing")));
    let mut bad_list = instance();
    bad_list["instance_id"] = json!("acme__calc-14");
    bad_list["FAIL_TO_PASS"] = json!("[not json");
    assert!(
        err(bad_list).is_err_and(|e| e.contains("FAIL_TO_PASS is a string but not a JSON list"))
    );
    let mut empty = instance();
    empty["instance_id"] = json!("acme__calc-15");
    empty["FAIL_TO_PASS"] = json!([]);
    assert!(err(empty).is_err_and(|e| e.contains("FAIL_TO_PASS is empty")));
    let mut bad_repo = instance();
    bad_repo["instance_id"] = json!("acme__calc-16");
    bad_repo["repo"] = json!("calc");
    assert!(err(bad_repo).is_err_and(|e| e.contains("is not owner/name")));
    // An id the task schema refuses names the field, as a floe task line would.
    let mut bad_id = instance();
    bad_id["instance_id"] = json!("acme calc");
    assert!(
        err(bad_id).is_err_and(|e| e.starts_with("line 2: id: ")),
        "{:?}",
        {
            let mut l = instance();
            l["instance_id"] = json!("acme calc");
            err(l)
        }
    );
    // The same instance twice is a duplicate id.
    assert!(matches!(
        parse_source(
            &format!("{}\n{}\n", instance(), instance()),
            &swebench_source(),
            Checkouts::Image
        ),
        Err(TaskFileError::DuplicateId {
            line: 2,
            first: 1,
            ..
        })
    ));
    assert_eq!(
        err(json!({"instance_id": "x"})).map_err(|e| e.contains("(instance x)")),
        Err(true)
    );
    assert!(err(json!([1])).is_err_and(|e| e.contains("JSON object")));
}

#[test]
fn patched_files_are_both_sides_of_each_header() {
    assert_eq!(
        patched_files(TEST_PATCH),
        ["tests/test_calc.py", "tests/test_new.py"]
    );
    assert_eq!(
        patched_files("--- a/x.py\t2024\n+++ b/y.py\n--- /dev/null\n"),
        ["x.py", "y.py"]
    );
    // A pure rename and a new empty file have no ---/+++ lines; quoted names are unquoted.
    let odd = "diff --git a/old.py b/new.py\nsimilarity index 100%\nrename from old.py\n\
               rename to new.py\ndiff --git a/empty.py b/empty.py\nnew file mode 100644\n\
               diff --git \"a/t\\303\\251st.py\" \"b/t\\303\\251st.py\"\n";
    assert_eq!(
        patched_files(odd),
        ["empty.py", "new.py", "old.py", "tést.py"]
    );
    // Each is protected as itself, not as a glob.
    assert_eq!(glob_literal("pages/[id].js"), "pages/[[]id[]].js");
}

#[test]
fn relocation_moves_whole_paths_outside_here_documents() {
    let script = "cd /testbed\ngit config --global --add safe.directory /testbed\n\
                  ls /testbed/src /testbed_other '/testbed' /x/testbed/y PATH=/testbed:$PATH\n\
                  git apply -v - <<'EOF_114329324912'\n--- a/testbed/x\n/testbed\n\
                  EOF_114329324912\npytest /testbed/tests\n";
    let moved = relocate(script, "/testbed", "/tmp/eval");
    assert_eq!(
        moved,
        "cd /tmp/eval\ngit config --global --add safe.directory /tmp/eval\n\
         ls /tmp/eval/src /testbed_other '/tmp/eval' /x/testbed/y PATH=/tmp/eval:$PATH\n\
         git apply -v - <<'EOF_114329324912'\n--- a/testbed/x\n/testbed\n\
         EOF_114329324912\npytest /tmp/eval/tests\n"
    );
    assert_eq!(relocate(script, "/testbed", "/testbed"), script);
    assert_eq!(relocate(script, "/testbed/", "/tmp/eval"), moved);
    // Arithmetic shifts and here-strings open no here-document; a hyphenated quoted delimiter
    // and a tab-indented `<<-` terminator close theirs.
    let shifts = "x=$((1<<2)); cat <<< /testbed\ncd /testbed\n";
    assert_eq!(
        relocate(shifts, "/testbed", "/e"),
        "x=$((1<<2)); cat <<< /e\ncd /e\n"
    );
    let hyphen = "cat <<'EOF-1'\n/testbed\nEOF-1\ncd /testbed>log\ncat <<-END\n/testbed\n\tEND\nls /testbed|wc\n";
    assert_eq!(
        relocate(hyphen, "/testbed", "/e"),
        "cat <<'EOF-1'\n/testbed\nEOF-1\ncd /e>log\ncat <<-END\n/testbed\n\tEND\nls /e|wc\n"
    );
}

#[test]
fn the_test_command_is_what_runs_between_the_markers() {
    let script = "cd /testbed\n: '>>>>> Start Test Output'\npytest -rA tests/test_x.py\n\
                  : '>>>>> End Test Output'\ngit checkout abc tests/test_x.py\n";
    assert_eq!(test_commands(script), ["pytest -rA tests/test_x.py"]);
    assert!(test_commands("pytest\n").is_empty());
}

/// Django's and sympy's test runners are files of their repositories (as swebench's specs
/// write their commands); pytest and tox come from the environment.
#[test]
fn a_test_runner_the_repository_holds_is_protected() {
    let script = |command: &str| {
        format!(": '>>>>> Start Test Output'\n{command}\n: '>>>>> End Test Output'\n")
    };
    for (command, runner) in [
        (
            "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 utils_tests.test_text",
            Some("tests/runtests.py"),
        ),
        (
            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose sympy/core/tests/test_basic.py",
            Some("bin/test"),
        ),
        ("python tests/runtests.py admin_views", Some("tests/runtests.py")),
        ("/testbed/scripts/run_tests.sh -k x", Some("scripts/run_tests.sh")),
        ("./run.sh", Some("run.sh")),
        ("bash runtests.sh tests/test_x.py", Some("runtests.sh")),
        ("python3.9 -W ignore tests/runtests.py x", Some("tests/runtests.py")),
        ("timeout 1800 ./tests/runtests.py x", Some("tests/runtests.py")),
        ("env X=1 './bin/test' x", Some("bin/test")),
        ("node_modules/.bin/jest x", Some("node_modules/.bin/jest")),
        ("pytest --no-header -rA tests/test_x.py", None),
        ("python -m pytest -rA tests/test_x.py", None),
        ("tox --current-env -epy39 -v -- tests/test_x.py", None),
        ("/usr/bin/python3 -m pytest", None),
    ] {
        assert_eq!(
            runner_scripts(&script(command), "/testbed"),
            runner.map(String::from).into_iter().collect::<Vec<_>>(),
            "{command}"
        );
    }
}

/// SWE-bench Multimodal's test baselines are downloaded by swebench's own harness; without
/// them every session fails its tests, a silent 0.
#[test]
fn an_instance_whose_tests_need_downloaded_assets_is_refused() {
    let mut line = instance();
    line["image_assets"] =
        json!({"problem_statement": ["https://x/issue.png"], "test_patch": ["https://x/baseline.png"]})
            .to_string()
            .into();
    let err =
        to_task(line.clone(), &SweBenchTasks::default(), Checkouts::Image).expect_err("refused");
    assert!(
        err.message.starts_with("image_assets names 1 file(s)"),
        "{err:?}"
    );
    line["image_assets"] = "{not json".into();
    let err =
        to_task(line.clone(), &SweBenchTasks::default(), Checkouts::Image).expect_err("refused");
    assert!(
        err.message.starts_with("image_assets is not JSON"),
        "{err:?}"
    );
    // Images of the issue alone: the agent reads the text.
    line["image_assets"] = json!({"problem_statement": ["https://x/issue.png"], "test_patch": []});
    to_task(line, &SweBenchTasks::default(), Checkouts::Image).expect("a task");
}

/// The statement framed as the job says, in one pass: a statement that holds `{repo}` keeps
/// it as written.
#[test]
fn the_instruction_frames_the_problem_statement_as_the_job_says() {
    let mut line = instance();
    line["problem_statement"] = "add() subtracts; see {repo}".into();
    line["hints_text"] = "try +".into();
    let settings = SweBenchTasks {
        instruction: "In {repo} ({instance_id}): {problem_statement}\nHints: {hints_text} {other}"
            .into(),
        ..Default::default()
    };
    let task = to_task(line.clone(), &settings, Checkouts::Image).expect("a task");
    assert_eq!(
        task.instruction,
        "In acme/calc (acme__calc-12): add() subtracts; see {repo}\nHints: try + {other}"
    );
    let verbatim = to_task(line.clone(), &SweBenchTasks::default(), Checkouts::Image);
    assert_eq!(
        verbatim.expect("a task").instruction,
        "add() subtracts; see {repo}"
    );
    let fixed = SweBenchTasks {
        instruction: "Fix the bug.".into(),
        ..Default::default()
    };
    let err = to_task(line, &fixed, Checkouts::Image).expect_err("no statement");
    assert!(err.message.contains("no {problem_statement}"), "{err:?}");
}
