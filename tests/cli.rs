//! The `dfsets` binary: datafusion-cli's flags with our functions installed, and the
//! README's quickstart giving the answers a reader can check by hand against
//! `examples/data/docs.csv`.

mod common;

use std::process::Command;

fn dfsets(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dfsets"))
        .current_dir(common::manifest_dir())
        .args(args)
        .output()
        .expect("dfsets runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn command_flag_runs_our_functions() {
    let (ok, stdout, stderr) = dfsets(&[
        "-q",
        "--format",
        "nd-json",
        "-c",
        "SELECT list_intersect([1, 3, 5, 7], [7, 5, 4], [5, 7, 9]) AS l, list_intersect_count([1, 2], [2, 3]) AS n",
    ]);
    assert!(ok, "{stderr}");
    // Step 1 probes the longer left list [1, 3, 5, 7] → [5, 7]; step 2 probes [5, 7, 9].
    assert_eq!(stdout.trim(), r#"{"l":[5,7],"n":1}"#);
}

#[test]
fn quickstart_answers() {
    let (ok, stdout, stderr) =
        dfsets(&["-q", "--format", "nd-json", "-f", "examples/quickstart.sql"]);
    assert!(ok, "{stderr}");
    assert!(!stdout.contains("Error"), "{stdout}");
    // Documents containing both "set" and "intersection": 1, 4 and 14 (22 says "sets").
    assert!(stdout.contains(r#"{"docs":[1,4,14],"n":3}"#), "{stdout}");
    // "posting", "lists" and "sorted" together: only document 21.
    assert!(
        stdout.contains(r#"{"doc_id":21,"text":"Document ids sorted in ascending order"#),
        "{stdout}"
    );
    // "conjunctive" and "query" share documents 1, 12 and 24.
    assert!(
        stdout.contains(r#"{"t1":"conjunctive","t2":"query","shared":[1,12,24],"n":3}"#),
        "{stdout}"
    );
    // "the", "of" and "intersection": 1, 12, 14 and 22.
    assert!(stdout.contains(r#"{"docs":[1,12,14,22]}"#), "{stdout}");
}

#[test]
fn sql_errors_are_reported() {
    let (_, stdout, stderr) = dfsets(&["-q", "-c", "SELECT list_intersect([1])"]);
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains("list_intersect expects at least 2 list arguments, got 1"),
        "{all}"
    );
}
