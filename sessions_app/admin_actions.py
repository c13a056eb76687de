"""Admin actions `terminate` and `force_terminate`, shared by the Session, Kernel, KeyPair
and Agent admins: a confirmation page, then one message per outcome with counts."""

from collections import Counter, defaultdict

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.stop import ResumeRefused, StopRefused, resume_session, stop_session
from sessions_app.models import Session
from sessions_app.querysets import may_force_terminate
from sessions_app.spec import DestroyRefused


def can_force(request):
    return may_force_terminate(request.user)


def destroy_sessions(request, sessions, *, forced):
    """Destroy each session; returns ({status: count}, {refusal message: [names]})."""
    done, refused = Counter(), defaultdict(list)
    for session in sessions:
        try:
            result = destroy_session(session, forced=forced, actor=request.user,
                                     reason="user-requested")
        except DestroyRefused as exc:
            refused[exc.rule].append(session.name)
        else:
            done[result.status] += 1
    return done, refused


def report(modeladmin, request, done, refused, *, forced):
    verb = "Force-terminated" if forced else "Terminated"
    if done:
        parts = ", ".join(f"{status}: {count}" for status, count in sorted(done.items()))
        modeladmin.message_user(request, f"{verb} {sum(done.values())} session(s) ({parts}).",
                                messages.SUCCESS)
    for message, names in refused.items():
        modeladmin.message_user(
            request, f"Refused {len(names)} session(s) — {message}: {', '.join(sorted(names))}.",
            messages.WARNING)
    if not done and not refused:
        modeladmin.message_user(request, "No live sessions among the selection.",
                                messages.INFO)


def destroy_action(*, forced, sessions_of):
    """An admin action over the live sessions that `sessions_of(queryset)` selects."""

    def action(modeladmin, request, queryset):
        if forced and not can_force(request):
            modeladmin.message_user(request, "You are not allowed to force-terminate",
                                    messages.ERROR)
            return None
        sessions = list(
            sessions_of(queryset).live()
            .select_related("user").prefetch_related("kernels").distinct()
        )
        if request.POST.get("confirm") != "yes":
            return TemplateResponse(request, "admin/sessions_app/confirm_destroy.html", {
                **modeladmin.admin_site.each_context(request),
                "title": "Force-terminate sessions?" if forced else "Terminate sessions?",
                "forced": forced,
                "sessions": sessions,
                "queryset": queryset,
                "action": request.POST.get("action"),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "opts": modeladmin.model._meta,
            })
        done, refused = destroy_sessions(request, sessions, forced=forced)
        report(modeladmin, request, done, refused, forced=forced)
        return None

    name = "force_terminate" if forced else "terminate"
    action.__name__ = name
    description = ("Force-terminate the live sessions of the selection" if forced
                   else "Terminate the live sessions of the selection")
    permissions = ("force_terminate",) if forced else ("change",)
    return admin.action(description=description, permissions=permissions)(action)


class DestroyActionsMixin:
    """Adds both actions; `sessions_of(queryset)` maps the admin's rows to sessions."""

    @staticmethod
    def sessions_of(queryset):
        raise NotImplementedError

    def get_actions(self, request):
        actions = super().get_actions(request)
        for forced in (False, True):
            action = destroy_action(forced=forced, sessions_of=self.sessions_of)
            actions[action.__name__] = (action, action.__name__, action.short_description)
        return {name: entry for name, entry in actions.items()
                if name != "force_terminate" or can_force(request)}

    def has_force_terminate_permission(self, request):
        return can_force(request)


def _stop_or_resume(modeladmin, request, queryset, *, do, refusal, verb):
    done, refused = 0, defaultdict(list)
    for session in queryset.select_related("keypair__resource_policy", "scaling_group"):
        try:
            do(session, actor=request.user)
        except refusal as exc:
            refused[exc.message].append(session.name)
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{verb} {done} session(s).", messages.SUCCESS)
    for message, names in refused.items():
        modeladmin.message_user(
            request, f"Refused {len(names)} session(s) — {message}: {', '.join(sorted(names))}.",
            messages.WARNING)


@admin.action(description="Stop the selected sessions (their files kept)",
              permissions=("change",))
def stop_sessions(modeladmin, request, queryset):
    _stop_or_resume(modeladmin, request, queryset, do=stop_session, refusal=StopRefused,
                    verb="Stopping")


@admin.action(description="Resume the selected stopped sessions", permissions=("change",))
def resume_sessions(modeladmin, request, queryset):
    _stop_or_resume(modeladmin, request, queryset, do=resume_session, refusal=ResumeRefused,
                    verb="Resuming")


def sessions_of_sessions(queryset):
    return Session.objects.filter(pk__in=queryset.values("pk"))


def sessions_of_kernels(queryset):
    return Session.objects.filter(kernels__in=queryset.values("pk"))


def sessions_of_keypairs(queryset):
    return Session.objects.filter(keypair__in=queryset.values("pk"))


def sessions_of_agents(queryset):
    return Session.objects.filter(kernels__agent__in=queryset.values("pk"))
