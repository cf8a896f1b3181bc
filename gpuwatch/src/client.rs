//! The command line's client side: every subcommand that asks a server (`sql`, `job`, `jobs`,
//! and those to come) takes the same [`ClientArgs`] (`--server`, `--token` / `--token-file` /
//! `GPUWATCH_TOKEN`, `--timeout`) and asks through one [`Client`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpuwatch_common::HumanDuration;

use crate::error::{Error, Result};

/// How every client subcommand reaches the server.
#[derive(Debug, Clone, Args)]
pub(crate) struct ClientArgs {
    /// The server to ask.
    #[arg(long, env = "GPUWATCH_SERVER", default_value = "http://127.0.0.1:9500")]
    pub server: String,
    /// Bearer token with the query scope, for a server started with --auth-tokens.
    #[arg(
        long,
        env = "GPUWATCH_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// File holding the bearer token (whitespace around it ignored), so it is not on the command
    /// line or in the environment.
    #[arg(long, env = "GPUWATCH_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Give up after this long.
    #[arg(long, env = "GPUWATCH_TIMEOUT", default_value = "60s")]
    pub timeout: HumanDuration,
}

impl ClientArgs {
    /// The client these arguments describe (the token file read now).
    pub(crate) fn client(&self) -> Result<Client> {
        let token = match (&self.token, &self.token_file) {
            (_, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::Config(format!("cannot read --token-file {}: {e}", path.display()))
                })?;
                let t = text.trim().to_string();
                if t.is_empty() {
                    return Err(Error::Config(format!(
                        "--token-file {} is empty: write the query token into it",
                        path.display()
                    )));
                }
                Some(t)
            }
            (Some(t), None) => Some(t.clone()).filter(|t| !t.is_empty()),
            (None, None) => None,
        };
        Ok(Client {
            server: self.server.clone(),
            token,
            timeout: self.timeout.get(),
        })
    }
}

/// Where and how the command line asks.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// Server base URL.
    pub server: String,
    /// Bearer token (query scope), if the server wants one.
    pub token: Option<String>,
    /// Time limit.
    pub timeout: Duration,
}

impl Client {
    /// `GET path_and_query`: the body of a 2xx answer, or the server's error.
    pub(crate) async fn get(&self, path_and_query: &str) -> Result<Vec<u8>> {
        Ok(self.get_with_header(path_and_query, "").await?.0)
    }

    /// `GET path_and_query`: the body of a 2xx answer and its header `header`, or the
    /// server's error.
    pub(crate) async fn get_with_header(
        &self,
        path_and_query: &str,
        header: &str,
    ) -> Result<(Vec<u8>, Option<String>)> {
        let http = self.http()?;
        let (body, headers) = self.exchange(http.get(self.url(path_and_query))).await?;
        let value = headers
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((body, value))
    }

    /// `POST path` with a JSON body: the body of a 2xx answer, or the server's error.
    pub(crate) async fn post_json(&self, path: &str, body: String) -> Result<Vec<u8>> {
        let http = self.http()?;
        let req = http
            .post(self.url(path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        Ok(self.exchange(req).await?.0)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.trim_end_matches('/'), path)
    }

    fn http(&self) -> Result<reqwest::Client> {
        reqwest::Client::builder()
            .timeout(self.timeout)
            .build()
            .map_err(Error::HttpClient)
    }

    async fn exchange(
        &self,
        mut req: reqwest::RequestBuilder,
    ) -> Result<(Vec<u8>, reqwest::header::HeaderMap)> {
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|source| Error::Unreachable {
            what: "cannot reach gpuwatch at",
            server: self.server.clone(),
            hint: ": is `gpuwatch serve` running there? set --server",
            source,
        })?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.map_err(|source| Error::Unreachable {
            what: "the answer broke off from",
            server: self.server.clone(),
            hint: "",
            source,
        })?;
        if (200..300).contains(&status) {
            return Ok((body.to_vec(), headers));
        }
        let msg = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        let hint = if status == 401 {
            " (pass a query token with --token, --token-file or GPUWATCH_TOKEN)"
        } else {
            ""
        };
        Err(Error::Remote(format!("{msg} ({status}){hint}")))
    }
}
