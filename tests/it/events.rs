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
