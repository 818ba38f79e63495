//! PostgreSQL failover (issue 22): the relay follows a promoted standby with nothing lost and
//! no phantom events.

use outbox_testkit as common;

use std::time::Duration;

use common::failover::{create_standby_oracle, FailoverPair, PairOptions};
use common::pg::{query_value, wait_count};
use common::{read_test_decoding, TcpProxy};

const MINUTE: Duration = Duration::from_secs(60);

fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// The test kit's pair: an oracle slot made on the standby decodes what the primary
/// commits, survives the promotion, and a proxy moved to the new primary reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kit_the_standby_oracle_survives_promotion_and_the_proxy_follows() {
    let pair = blocking(|| FailoverPair::start(17, PairOptions::default(), &[]));
    let db = common::unique_name("kit");
    pair.primary.create_database(&db).await;
    let primary = pair.primary.client(&db).await;
    primary
        .batch_execute("CREATE TABLE t (id text PRIMARY KEY)")
        .await
        .unwrap();
    create_standby_oracle(&pair, &db, "oracle").await;
    primary
        .batch_execute("INSERT INTO t VALUES ('before the kill')")
        .await
        .unwrap();

    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pair.primary.port()));
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    let before = common::pg_connect(&via_proxy).await;
    let port: String = query_value(&before, "SHOW port").await;
    assert_eq!(port, pair.primary.port().to_string());
    let replicated = pair.standby.client(&db).await;
    let synced = wait_count(&replicated, "SELECT count(*) FROM t", MINUTE, |n| n == 1).await;
    assert_eq!(synced, Ok(1), "the standby has the row");

    blocking(|| pair.primary.stop_immediate());
    let client = pair.promote(&db).await;
    proxy.retarget(&format!("127.0.0.1:{}", pair.standby.port()));
    assert!(
        before.simple_query("SELECT 1").await.is_err(),
        "reset by the move"
    );
    let after = common::pg_connect(&via_proxy).await;
    let port: String = query_value(&after, "SHOW port").await;
    assert_eq!(port, pair.standby.port().to_string());
    let oracle = read_test_decoding(&client, "oracle").await;
    let ids: Vec<String> = oracle
        .iter()
        .flat_map(|t| t.inserted_ids("public.t"))
        .collect();
    assert_eq!(
        ids,
        ["before the kill"],
        "the oracle kept what the standby had"
    );
}
