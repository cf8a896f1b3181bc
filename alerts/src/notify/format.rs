//! Each receiver's payload, within its documented limits.
//!
//! | kind | format | limits kept |
//! | --- | --- | --- |
//! | slack | Block Kit: `text` fallback, `header` + `section` (mrkdwn) + `context` blocks | 50 blocks, header text 150 chars, section text 3000, fallback text 3000 |
//! | teams | Workflows webhook: a `message` with one Adaptive Card 1.4 attachment | whole payload under 28 KB |
//! | discord | one embed: title, description, colour, fields, timestamp | title 256, description 4096, 25 fields (name 256, value 1024), footer 2048, all text 6000 |
//! | webhook | Alertmanager webhook v4 JSON | none (Alertmanager's `max_alerts` is not set) |
//! | alertmanager | Alertmanager API v2 `postableAlerts` array | none |

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::{Message, NAlert};

/// Slack: blocks per message.
pub const SLACK_MAX_BLOCKS: usize = 50;
/// Slack: characters of a header block's text.
pub const SLACK_HEADER_MAX: usize = 150;
/// Slack: characters of a section block's text.
pub const SLACK_SECTION_MAX: usize = 3000;
/// Teams: bytes of a webhook payload.
pub const TEAMS_MAX_BYTES: usize = 28 * 1024;
/// Discord: embed title characters.
pub const DISCORD_TITLE_MAX: usize = 256;
/// Discord: embed description characters.
pub const DISCORD_DESCRIPTION_MAX: usize = 4096;
/// Discord: fields per embed.
pub const DISCORD_FIELDS_MAX: usize = 25;
/// Discord: field name characters.
pub const DISCORD_FIELD_NAME_MAX: usize = 256;
/// Discord: field value characters.
pub const DISCORD_FIELD_VALUE_MAX: usize = 1024;
/// Discord: all text of all embeds of a message.
pub const DISCORD_TOTAL_MAX: usize = 6000;

/// RFC 3339 with milliseconds, UTC; Alertmanager's zero time for `None`.
pub fn rfc3339(ns: Option<i64>) -> String {
    match ns {
        Some(n) => {
            DateTime::<Utc>::from_timestamp_nanos(n).to_rfc3339_opts(SecondsFormat::Millis, true)
        }
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

/// Cuts `s` to at most `max` characters, ending with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn title(m: &Message) -> String {
    let firing = m.alerts.iter().filter(|a| a.status == "firing").count();
    let name = m
        .group_labels
        .get("alertname")
        .or_else(|| m.common_labels.get("alertname"))
        .cloned()
        .unwrap_or_else(|| "alerts".into());
    let others: Vec<String> = m
        .group_labels
        .iter()
        .filter(|(k, _)| k.as_str() != "alertname")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut t = if m.status == "firing" {
        format!("[FIRING:{firing}] {name}")
    } else {
        format!("[RESOLVED] {name}")
    };
    if !others.is_empty() {
        t.push_str(&format!(" ({})", others.join(" ")));
    }
    t
}

fn summary(a: &NAlert) -> String {
    a.annotations
        .get("summary")
        .or_else(|| a.annotations.get("description"))
        .cloned()
        .unwrap_or_else(|| a.labels.get("alertname").cloned().unwrap_or_default())
}

fn label_line(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .filter(|(k, _)| k.as_str() != "alertname")
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Alertmanager webhook v4.
pub fn webhook(m: &Message) -> Value {
    json!({
        "version": "4",
        "groupKey": m.group_key,
        "truncatedAlerts": 0,
        "status": m.status,
        "receiver": m.receiver,
        "groupLabels": m.group_labels,
        "commonLabels": m.common_labels,
        "commonAnnotations": m.common_annotations,
        "externalURL": m.external_url,
        "alerts": m.alerts.iter().map(|a| json!({
            "status": a.status,
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": rfc3339(Some(a.starts_at)),
            "endsAt": rfc3339(a.ends_at),
            "generatorURL": generator_url(m, a),
            "fingerprint": a.fingerprint,
        })).collect::<Vec<_>>(),
    })
}

fn generator_url(m: &Message, a: &NAlert) -> String {
    let rule = a.labels.get("alertname").cloned().unwrap_or_default();
    format!(
        "{}/api/v1/alerts?rule={rule}",
        m.external_url.trim_end_matches('/')
    )
}

/// Alertmanager API v2 `postableAlerts`: every alert with its end time (firing ones end at
/// `ends_at`, set by the caller to a few resend intervals ahead, as Prometheus does).
pub fn alertmanager(m: &Message) -> Value {
    Value::Array(
        m.alerts
            .iter()
            .map(|a| {
                json!({
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "startsAt": rfc3339(Some(a.starts_at)),
                    "endsAt": rfc3339(a.ends_at),
                    "generatorURL": generator_url(m, a),
                })
            })
            .collect(),
    )
}

/// Slack Block Kit.
pub fn slack(m: &Message) -> Value {
    let head = title(m);
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": truncate(&head, SLACK_HEADER_MAX), "emoji": true}
    })];
    // header + alerts + (maybe) "and N more" context + footer context
    let room = SLACK_MAX_BLOCKS - 3;
    for a in m.alerts.iter().take(room) {
        let icon = if a.status == "firing" {
            ":red_circle:"
        } else {
            ":large_green_circle:"
        };
        let mut text = format!("{icon} *{}*", summary(a));
        let labels = label_line(&a.labels);
        if !labels.is_empty() {
            text.push_str(&format!("\n`{labels}`"));
        }
        if let Some(d) = a.annotations.get("description") {
            text.push('\n');
            text.push_str(d);
        }
        blocks.push(json!({
            "type": "section",
            "text": {"type": "mrkdwn", "text": truncate(&text, SLACK_SECTION_MAX)}
        }));
    }
    if m.alerts.len() > room {
        blocks.push(json!({
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": format!("and {} more alerts", m.alerts.len() - room)}]
        }));
    }
    blocks.push(json!({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": truncate(&format!("gpuwatch · {}", m.external_url), SLACK_SECTION_MAX)}]
    }));
    debug_assert!(blocks.len() <= SLACK_MAX_BLOCKS);
    let fallback = std::iter::once(head)
        .chain(m.alerts.iter().map(summary))
        .collect::<Vec<_>>()
        .join("\n");
    json!({"text": truncate(&fallback, SLACK_SECTION_MAX), "blocks": blocks})
}

/// Microsoft Teams Workflows: a message with an Adaptive Card.
pub fn teams(m: &Message) -> Value {
    let color = if m.status == "firing" {
        "attention"
    } else {
        "good"
    };
    let build = |alerts: &[NAlert], more: usize| {
        let mut body = vec![json!({
            "type": "TextBlock", "text": title(m), "weight": "bolder", "size": "medium",
            "color": color, "wrap": true
        })];
        for a in alerts {
            body.push(
                json!({"type": "TextBlock", "text": summary(a), "wrap": true, "separator": true}),
            );
            let facts: Vec<Value> = a
                .labels
                .iter()
                .map(|(k, v)| json!({"title": k, "value": v}))
                .chain(std::iter::once(
                    json!({"title": "status", "value": a.status}),
                ))
                .collect();
            body.push(json!({"type": "FactSet", "facts": facts}));
        }
        if more > 0 {
            body.push(json!({"type": "TextBlock", "text": format!("and {more} more alerts"), "isSubtle": true}));
        }
        json!({
            "type": "message",
            "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": null,
                "content": {
                    "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                    "type": "AdaptiveCard",
                    "version": "1.4",
                    "msteams": {"width": "Full"},
                    "body": body,
                    "actions": [{"type": "Action.OpenUrl", "title": "Open gpuwatch", "url": m.external_url}]
                }
            }]
        })
    };
    let mut n = m.alerts.len();
    loop {
        let v = build(&m.alerts[..n], m.alerts.len() - n);
        if n == 0 || v.to_string().len() <= TEAMS_MAX_BYTES {
            return v;
        }
        n /= 2;
    }
}

/// Discord: one embed.
pub fn discord(m: &Message) -> Value {
    let color = if m.status == "firing" {
        0xE0_1E_5A
    } else {
        0x2E_B6_7D
    };
    let t = truncate(&title(m), DISCORD_TITLE_MAX);
    let fields: Vec<Value> = m
        .common_labels
        .iter()
        .filter(|(k, _)| k.as_str() != "alertname")
        .take(DISCORD_FIELDS_MAX)
        .map(|(k, v)| {
            json!({"name": truncate(k, DISCORD_FIELD_NAME_MAX), "value": truncate(v, DISCORD_FIELD_VALUE_MAX), "inline": true})
        })
        .collect();
    let used: usize = t.chars().count()
        + fields
            .iter()
            .map(|f| {
                f["name"].as_str().map_or(0, |s| s.chars().count())
                    + f["value"].as_str().map_or(0, |s| s.chars().count())
            })
            .sum::<usize>();
    let footer = "gpuwatch";
    let room = DISCORD_TOTAL_MAX
        .saturating_sub(used + footer.len())
        .min(DISCORD_DESCRIPTION_MAX);
    let description = m
        .alerts
        .iter()
        .map(|a| {
            let icon = if a.status == "firing" { "🔴" } else { "🟢" };
            format!("{icon} **{}**\n{}", summary(a), label_line(&a.labels))
        })
        .collect::<Vec<_>>()
        .join("\n\n");
    json!({
        "embeds": [{
            "title": t,
            "description": truncate(&description, room),
            "color": color,
            "fields": fields,
            "footer": {"text": footer},
            "timestamp": rfc3339(m.alerts.first().map(|a| a.ends_at.unwrap_or(a.starts_at))),
        }]
    })
}
