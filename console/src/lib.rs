//! gpuwatch's web console: plain HTML, CSS and JavaScript embedded in the binary at build time
//! (no Node build, no CDN), served at `/` of the HTTP port.
//!
//! Data flow: the page is static; every figure it shows comes from the server's own APIs
//! (`/api/v1/sql`, `/api/v1/jobs`, `/api/v1/alerts`, `/api/v1/silences`), called from the browser
//! with the same bearer token as any other client. The assets here carry no data, so they are
//! served without a token; with `--auth-tokens` the page asks for a token before it shows
//! anything. Charts use uPlot (MIT, vendored in `assets/vendor/` with its licence).
//!
//! The one seam is [`router`], which the `gpuwatch` binary merges into its HTTP router.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// Every file the console serves, by URL path.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../assets/index.html"),
    },
    Asset {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/app.js"),
    },
    Asset {
        path: "/console/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/app.css"),
    },
    Asset {
        path: "/console/favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../assets/favicon.svg"),
    },
    Asset {
        path: "/console/vendor/uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/vendor/uPlot.iife.min.js"),
    },
    Asset {
        path: "/console/vendor/uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/vendor/uPlot.min.css"),
    },
    Asset {
        path: "/console/vendor/uPlot.LICENSE",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("../assets/vendor/uPlot.LICENSE"),
    },
];

/// Only this origin's scripts, styles and API calls; no inline script, no third party.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn serve(asset: &'static Asset) -> Response {
    let mut resp = (StatusCode::OK, asset.body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // The page changes with the binary: revalidate rather than cache across upgrades.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// The console's routes: `/` and `/console/*` (static files only, no data).
pub fn router() -> Router {
    let mut r = Router::new();
    for asset in ASSETS {
        r = r.route(asset.path, get(move || async move { serve(asset) }));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn every_asset_is_served_and_the_page_loads_only_local_files() {
        for asset in ASSETS {
            let resp = router()
                .oneshot(
                    Request::get(asset.path)
                        .body(Body::empty())
                        .expect("request"),
                )
                .await
                .expect("answer");
            assert_eq!(resp.status(), StatusCode::OK, "{}", asset.path);
            assert_eq!(
                resp.headers()[header::CONTENT_TYPE],
                asset.content_type,
                "{}",
                asset.path
            );
            assert!(!asset.body.is_empty());
        }
        let html = std::str::from_utf8(ASSETS[0].body).expect("utf-8");
        // Every src/href of the page is one of ours: nothing from a CDN, works offline.
        for attr in ["src=\"", "href=\""] {
            for part in html.split(attr).skip(1) {
                let url = part.split('"').next().unwrap_or_default();
                assert!(
                    url.starts_with('#') || ASSETS.iter().any(|a| a.path == url),
                    "{url} is not an embedded asset"
                );
            }
        }
        assert!(!html.contains("<script>"), "no inline script (CSP)");
    }
}
