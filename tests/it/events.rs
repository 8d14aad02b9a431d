//! `GET /events`: resumable, filtered, tenant-isolated.

use std::time::Duration;

use futures::StreamExt;

use crate::common::Appliance;

/// Reads SSE events (id, event, data) until `n` arrived.
async fn read_sse(response: reqwest::Response, n: usize) -> Vec<(u64, String, serde_json::Value)> {
    assert_eq!(response.status(), 200, "{:?}", response.headers());
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while events.len() < n {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("events within 10 s")
            .expect("the stream stays open")
            .unwrap();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(id) = id {
                events.push((id, event, serde_json::from_str(&data).unwrap()));
            }
        }
    }
    events
}

#[tokio::test]
async fn events_resume_after_the_last_id_and_filter_by_topic_and_tenant() {
    let a = Appliance::start();
    let acme = a
        .create_client("acme", &["agentbay.events.read", "agentbay.admin"])
        .await;
    a.create_client("globex", &["factory.runs.read"]).await;
    a.create_client("acme", &["factory.runs.read"]).await;
    let admin = a.admin_token().await;

    // The PlatformAdmin sees all four creations (bootstrap included).
    let all = a
        .http()
        .get(format!(
            "{}/events?topic=agentbay.admin.v1.client-created",
            a.url
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(all.headers()["content-type"], "text/event-stream");
    let events = read_sse(all, 4).await;
    let ids: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(
        events
            .iter()
            .all(|e| e.1 == "agentbay.admin.v1.client-created")
    );

    // Resume after the second: the third comes first.
    let resumed = a
        .http()
        .get(format!(
            "{}/events?topic=agentbay.admin.v1.client-created",
            a.url
        ))
        .bearer_auth(&admin)
        .header("Last-Event-ID", ids[1].to_string())
        .send()
        .await
        .unwrap();
    let events = read_sse(resumed, 2).await;
    assert_eq!(events[0].0, ids[2]);

    // A tenant sees only its own, live ones included.
    let token = a.token(&acme).await;
    let mine = a
        .http()
        .get(format!("{}/events?topic=agentbay.admin.v1", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let later = {
        let a_url = a.url.clone();
        let http = a.http();
        let admin = admin.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // One for globex (must not show), one for acme (must show).
            for tenant in ["globex", "acme"] {
                let r = http
                    .post(format!("{a_url}/agentbay.admin.v1.Admin/CreateClient"))
                    .bearer_auth(&admin)
                    .header("content-type", "application/json")
                    .body(format!(
                        r#"{{"tenantId":"{tenant}","scopes":["factory.runs.read"]}}"#
                    ))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        })
    };
    let events = read_sse(mine, 3).await;
    later.await.unwrap();
    assert!(
        events.iter().all(|e| e.2["tenantId"] == "acme"),
        "{events:?}"
    );
    assert_eq!(events.len(), 3);

    let bad = a
        .http()
        .get(format!("{}/events", a.url))
        .bearer_auth(&admin)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn a_reader_catches_up_to_the_head_and_its_stream_ends_there() {
    use agentbay::proto::agentbay::admin::v1 as pb;
    let a = Appliance::start();
    for tenant in ["acme", "globex", "acme"] {
        a.create_client(tenant, &["factory.runs.read"]).await;
    }
    let admin = a.admin_token().await;
    let head = a.get(&admin, "/events/head").await["sequence"]
        .as_u64()
        .unwrap();
    assert!(head >= 3, "{head}");
    // The stream up to the head ends by itself, having delivered every
    // event up to it and none after.
    let response = a
        .http()
        .get(format!("{}/events?until={head}", a.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["agentbay-events-head"], head.to_string());
    let body = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .expect("the stream ends at the head")
        .unwrap();
    let ids: Vec<u64> = body
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=head).collect::<Vec<_>>());
    // Past the head is refused (the outbox is not there yet), naming the
    // field.
    let beyond = a
        .http()
        .get(format!("{}/events?until={}", a.url, head + 1000))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let (status, problem) = crate::common::problem(beyond).await;
    assert_eq!((status, problem["field"].as_str()), (409, Some("until")));
    // The same over RPC: the head, then a stream that ends there.
    let rpc = a.rpc_json(&admin);
    let rpc_head = rpc
        .get_events_head(pb::GetEventsHeadRequest::default())
        .await
        .unwrap()
        .into_owned()
        .sequence;
    assert!(rpc_head >= head);
    let mut stream = rpc
        .watch_events(pb::WatchEventsRequest {
            until_sequence: rpc_head,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut last = 0;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends at the head")
        .unwrap()
    {
        last = event.to_owned_message().sequence;
    }
    assert_eq!(last, rpc_head);
}
