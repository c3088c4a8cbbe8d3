from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path

from actions.orders import views as order_views
from actions.provider_events import views as webhook_views
from actions.review import views as actions_views
from console import account, agent_pages, export_views, metrics, notification_views, views

# The pages of one agent, for its owner: its tokens, its webhook and the webhook's deliveries.
agent_urls = [
    path("", agent_pages.agent_page, name="agent-page"),
    path("tokens", account.agent_token_issue_view, name="agent-token-issue"),
    path("tokens/<int:token_pk>/rotate", account.agent_token_rotate_view, name="agent-token-rotate"),
    path("tokens/<int:token_pk>/revoke", account.agent_token_revoke_view, name="agent-token-revoke"),
    path("webhook", agent_pages.agent_webhook_set, name="agent-webhook-set"),
    path("webhook/rotate", agent_pages.agent_webhook_rotate, name="agent-webhook-rotate"),
    path("webhook/disable", agent_pages.agent_webhook_disable, name="agent-webhook-disable"),
    path("deliveries/<int:delivery_pk>/redeliver", agent_pages.agent_webhook_redeliver, name="agent-webhook-redeliver"),
]

# A person's own settings: password, two-factor, time zone, notifications, the agents they own.
account_urls: list[URLPattern | URLResolver] = [
    path("", account.account, name="account"),
    path("time-zone", account.time_zone_update, name="account-time-zone"),
    path("password/", account.PasswordChange.as_view(), name="password-change"),
    path("two-factor/", account.two_factor_setup, name="two-factor-setup"),
    path("verify/", account.two_factor_verify, name="two-factor-verify"),
    path("notifications", account.notification_settings_save, name="notification-settings"),
    path("agents/<int:pk>/", include(agent_urls)),
]

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("nav/waiting", views.nav_waiting, name="nav-waiting"),
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/", include(account_urls)),
    path("notifications/", notification_views.notification_list, name="notifications"),
    path("notifications/<int:pk>/read", notification_views.notification_read, name="notification-read"),
    path("notifications/read-all", notification_views.notification_read_all, name="notifications-read-all"),
    path("exports/", export_views.exports, name="exports"),
    path("exports/actions.csv", export_views.export_actions, name="export-actions"),
    path("exports/audit-trail.csv", export_views.export_trail, name="export-trail"),
    path("approvals/", include("approvals.urls")),
    path("review/", include("actions.urls")),
    path("search", order_views.search_view, name="search"),
    path("orders/<int:pk>", order_views.order_detail, name="order-detail"),
    path("kinds/", actions_views.kinds, name="kinds"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("actions.api.urls")),
    path("metrics", metrics.metrics, name="metrics"),
    path("webhooks/stripe", webhook_views.stripe_webhook, name="stripe-webhook"),
]
