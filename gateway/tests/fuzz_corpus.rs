//! Every input the fuzzer kept (`fuzz/corpus/<target>/`, minimized by `scripts/fuzz.sh --minimize`, and
//! the hand-written `fuzz/seeds/<target>/`) through the same entry point its libFuzzer target
//! calls: each returns, none panics. A regression check on every test run; finding new
//! inputs is `scripts/fuzz.sh`'s job (`docs/testing.md`, "Fuzzing").

use std::path::{Path, PathBuf};

use floe_gateway::protocol::fuzz_inputs::TARGETS;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_kept_fuzz_input_is_read_without_a_panic() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    for (target, read) in TARGETS {
        let corpus = inputs(&fuzz.join("corpus").join(target));
        // An empty corpus would make this test pass without reading anything.
        assert!(
            corpus.len() >= 50,
            "fuzz/corpus/{target} holds {} inputs: run scripts/fuzz.sh --minimize",
            corpus.len()
        );
        for file in corpus
            .iter()
            .chain(&inputs(&fuzz.join("seeds").join(target)))
        {
            let body = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let outcome = std::panic::catch_unwind(|| read(&body));
            assert!(outcome.is_ok(), "{target} panicked on {}", file.display());
        }
    }
}
