from __future__ import annotations

from django.urls import path

from approvals import views

urlpatterns = [
    path("", views.inbox, name="approvals-inbox"),
]
