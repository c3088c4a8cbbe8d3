from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from actions import views as actions_views
from actions import webhook_views
from console import metrics, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("approvals/", include("approvals.urls")),
    path("review/", include("actions.urls")),
    path("kinds/", actions_views.kinds, name="kinds"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("actions.api.urls")),
    path("metrics", metrics.metrics, name="metrics"),
    path("webhooks/stripe", webhook_views.stripe_webhook, name="stripe-webhook"),
]
