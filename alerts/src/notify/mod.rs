//! Notification.
