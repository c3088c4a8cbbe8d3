from __future__ import annotations

from django.urls import path

from approvals import policy_change_views, views, workflow_views

urlpatterns = [
    path("", views.inbox, name="approvals-inbox"),
    path("<int:pk>/", views.detail, name="approvals-detail"),
    path("<int:pk>/decide", views.decide, name="approvals-decide"),
    path("<int:pk>/reopen", views.reopen, name="approvals-reopen"),
    path("<int:pk>/undo-reject", views.undo_reject, name="approvals-undo-reject"),
    path("<int:pk>/row", views.row, name="approvals-row"),
    path("<int:pk>/outcome", views.outcome, name="approvals-outcome"),
    path("decided/", views.decided, name="approvals-decided"),
    path("groups/<str:key>/summary", views.group_summary, name="approvals-group-summary"),
    path("approve-together", views.decide_group, name="approvals-decide-group"),
    path("workflows/", workflow_views.plan_inbox, name="approvals-workflows"),
    path("workflows/<int:pk>/", workflow_views.plan_detail, name="approvals-workflow"),
    path("workflows/<int:pk>/decide", workflow_views.plan_decide_view, name="approvals-workflow-decide"),
    path("policy-changes/", policy_change_views.policy_changes, name="approvals-policy-changes"),
    path(
        "policy-changes/<int:pk>/confirm",
        policy_change_views.policy_change_confirm_view,
        name="approvals-policy-change-confirm",
    ),
    path(
        "policy-changes/<int:pk>/reject",
        policy_change_views.policy_change_reject_view,
        name="approvals-policy-change-reject",
    ),
]
