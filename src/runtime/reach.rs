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
