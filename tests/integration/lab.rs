//! The strategy lab at small sizes: the safe strategies never oversell, and
//! the Redis experiments observe what they expect.
use flashsale::qa::lab::{run_experiments, run_lab, Contest, LabConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn safe_strategies_never_oversell() {
    let mut config = LabConfig::from_env();
    config.contests = vec![
        Contest {
            units: 5,
            requests: 20,
            workers: 20,
        },
        Contest {
            units: 10,
            requests: 60,
            workers: 8,
        },
    ];
    let report = run_lab(&config).await.unwrap();
    println!("{}", report.markdown());
    assert_eq!(report.contests.len(), 2);
    for contest in &report.contests {
        assert_eq!(contest.results.len(), config.strategies.len());
        for result in &contest.results {
            let answered = result.sold + result.rejected + result.gave_up + result.errors;
            assert_eq!(answered, contest.contest.requests, "{}", result.label);
        }
    }
    // Unsafe strategies are only reported: a short run may or may not show their race.
    assert!(report.failures().is_empty(), "{:#?}", report.failures());
}

#[tokio::test]
async fn redis_experiments_observe_what_they_expect() {
    let config = LabConfig::from_env();
    let experiments = run_experiments(&config.redis_url).await.unwrap();
    assert_eq!(experiments.len(), 5);
    for experiment in &experiments {
        assert!(experiment.pass, "{experiment:#?}");
    }
}
