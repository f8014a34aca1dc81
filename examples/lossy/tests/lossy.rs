//! The lossy-network proof as a test: the binary's code, with the binary's defaults.

use lossy::{Settings, DEFAULT_ORDERS};

#[tokio::test(flavor = "multi_thread")]
async fn one_key_per_intent_leaves_no_duplicates_on_a_lossy_network() {
    let report = lossy::run(Settings::default()).await.unwrap();
    println!("{report}");
    let (naive, idempotent) = (report.naive, report.idempotent);
    assert_eq!(naive.intents, DEFAULT_ORDERS);

    assert_eq!(idempotent.duplicates, 0, "{report}");
    assert_eq!(idempotent.orders, DEFAULT_ORDERS, "{report}");
    assert_eq!(idempotent.failed, 0, "{report}");
    assert!(idempotent.dropped > 0, "the proxy lost answers: {report}");

    // Each lost answer made the naive client place the order again.
    assert_eq!(naive.duplicates, naive.dropped - naive.failed, "{report}");
    let expected = report.expected_naive();
    assert!(
        expected.sigmas(naive.duplicates) <= 4.0,
        "{} duplicates, expected {:.1} ± {:.1}: {report}",
        naive.duplicates,
        expected.mean,
        expected.sd
    );
}
