//! The `dfsets` binary: datafusion-cli's flags with our functions installed, and the
//! README's quickstart giving the answers of its bundled corpus (`examples/data/`).

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
    // One answer of each feature, checked against an independent computation over
    // examples/data/debian-packages.json (examples/data/README.md).
    for line in [
        // BM25: the best package for "IMAP server".
        r#"{"rank":1,"package":"dovecot-imapd","score":5.893,"description":"secure POP3/IMAP server - IMAP daemon"}"#,
        // The similarity join's table function: the most similar large dependency sets.
        r#"{"package_a":"mariadb-backup","package_b":"mariadb-server-core","jaccard":0.833,"deps_a":11,"deps_b":11}"#,
        // The same join written in SQL: every pair at Jaccard >= 0.8.
        r#"{"pairs":1052,"identical":972}"#,
        // list_intersect_count / jaccard / list_intersect of two packages' dependencies.
        r#"{"a":"postfix","b":"exim4-daemon-light","common":5,"jaccard":0.227,"names":["debconf","debconf-2.0","libc6","libdb5.3","libnsl2"]}"#,
        // list_intersect_agg: a conjunctive query over reverse-dependency lists.
        r#"{"package":"exim4-daemon-heavy","description":"Exim MTA (v4) daemon with extended features, including exiscan-acl"}"#,
    ] {
        assert!(stdout.contains(line), "missing {line} in\n{stdout}");
    }
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
