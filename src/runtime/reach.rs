//! The site's network rule at call time: a target a release names is
//! resolved here, and reached only when the site's allowlist
//! ([`crate::domain::reach`]) allows it and every address it resolves to.

use std::net::SocketAddr;

use crate::domain::reach::{SiteReach, Target};

/// The addresses `target` may be reached at under `site`, or why not.
pub async fn resolve_allowed(
    site: &SiteReach,
    what: &str,
    target: &Target,
) -> Result<Vec<SocketAddr>, String> {
    // Listed or not is known before any lookup.
    if let Some(why) = site.target_refusal(what, target, &[]) {
        return Err(why);
    }
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("{what} {target}: its host does not resolve: {e}"))?
        .collect();
    let ips: Vec<_> = addresses.iter().map(SocketAddr::ip).collect();
    match site.target_refusal(what, target, &ips) {
        Some(why) => Err(why),
        None => Ok(addresses),
    }
}

/// An HTTP client that reaches `url` only at the addresses the site's rule
/// was just checked against, or why `url` may not be reached.
///
/// The host is looked up once, here, and the client is pinned to those
/// addresses: a name that resolves elsewhere a moment later (DNS
/// rebinding) is never looked up again. It follows no redirect, so an
/// allowed server cannot send the appliance on to a target the site did
/// not allow (loopback, its own listener, cloud metadata).
pub async fn pinned_client(
    site: &SiteReach,
    what: &str,
    url: &str,
    connect_timeout: std::time::Duration,
) -> Result<reqwest::Client, String> {
    let target = Target::of_url(url).map_err(|why| format!("{what} {why}"))?;
    let addresses = resolve_allowed(site, what, &target).await?;
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none());
    if target.host.parse::<std::net::IpAddr>().is_err() {
        builder = builder.resolve_to_addrs(&target.host, &addresses);
    }
    builder
        .build()
        .map_err(|e| format!("{what} {target}: no HTTP client: {e}"))
}
