//! The binary, run as a user would.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_calculator"))
        .args(args)
        .output()
        .expect("the calculator runs")
}

#[test]
fn the_defaults_print_the_reference_numbers() {
    let output = run(&[]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for line in [
        "duplicate orders per day        20\n",
        "duplicate orders per month      600 (30 days)\n",
        "money at risk per month         $24,000\n",
        "key store size                  about 20 MB (20,000 records of 1 KB)\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
}

#[test]
fn flags_change_the_numbers() {
    let output = run(&[
        "--requests-per-day",
        "100000",
        "--timeout-rate",
        "1%",
        "--succeeded-share",
        "0.5",
        "--order-value",
        "$25",
        "--retention",
        "48h",
        "--record-size",
        "2KB",
    ]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("duplicate orders per day        500\n"),
        "{text}"
    );
    assert!(
        text.contains("money at risk per month         $375,000\n"),
        "{text}"
    );
    assert!(
        text.contains("about 400 MB (200,000 records of 2 KB)"),
        "{text}"
    );
}

#[test]
fn a_bad_flag_says_what_to_write() {
    let output = run(&["--timeout-rate", "lots"]);
    assert!(!output.status.success());
    let text = String::from_utf8(output.stderr).unwrap();
    assert!(text.contains("write a percentage like 0.2%"), "{text}");
}
