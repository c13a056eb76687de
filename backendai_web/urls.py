import contextlib

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.shortcuts import redirect
from django.urls import Resolver404, include, path, re_path, resolve
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounting_app.api.views import UsageViewSet
from accounting_app.compat import views as compat_usage
from agents_app.api.views import AgentViewSet, ImageViewSet
from backendai_web import __version__
from backendai_web.metrics_view import metrics_view
from identity_app.api.views import KeyPairViewSet, ResourcePolicyViewSet
from identity_app.models import Domain, KeyPair, Project, ResourcePolicy
from scheduling_app.api.views import ScalingGroupViewSet
from sessions_app.api.errors import error_body
from sessions_app.api.resources import KernelViewSet
from sessions_app.api.views import SessionViewSet
from sessions_app.compat import files as session_files
from sessions_app.compat import manager as compat_manager
from sessions_app.compat import resources as compat_resources
from sessions_app.compat import templates as compat_templates
from sessions_app.compat import views as compat
from sessions_app.compat.graphql import GraphQLEndpoint
from sessions_app.realtime.streams import with_follow_up
from storage_app.api.views import FolderViewSet
from storage_app.compat import proxy as folders_proxy
from storage_app.compat import sharing as folders_sharing
from storage_app.compat import views as folders_compat

# The newest API version whose behaviour this server implements; older clients negotiate
# down to theirs (the 23.9.10 client: v7.20230615).
API_VERSION = "v8.20240915"

# No `.json`-style suffix routes: no client uses them (?format= chooses a rendering), and
# the viewsets' extra actions do not take the `format` argument they would pass.
router = DefaultRouter()
router.include_format_suffixes = False
router.register("sessions", SessionViewSet, basename="session")
router.register("kernels", KernelViewSet, basename="kernel")
router.register("agents", AgentViewSet, basename="agent")
router.register("images", ImageViewSet, basename="image")
router.register("keypairs", KeyPairViewSet, basename="keypair")
router.register("scaling-groups", ScalingGroupViewSet, basename="scaling-group")
router.register("folders", FolderViewSet, basename="folder")
router.register("resource-policies", ResourcePolicyViewSet,
                basename="resource-policy")
router.register("usage", UsageViewSet, basename="usage")


def root(request):
    """Backend.AI clients read the API version here; a browser goes to the dashboard."""
    if request.get_preferred_type(["application/json", "text/html"]) == "text/html":
        return redirect("dashboard:sessions")
    return JsonResponse({"version": API_VERSION, "manager": __version__})


def not_found(request, rest=""):
    """JSON, not Django's HTML page, for unknown API and Backend.AI-compatible paths."""
    message = f"There is no {request.path}."
    if not request.path.endswith("/"):
        with contextlib.suppress(Resolver404):
            if resolve(request.path + "/").func is not not_found:
                message += f" Did you mean {request.path}/ ?"
    return JsonResponse(error_body(404, message), status=404)




def not_supported(reason):
    return compat.NotSupported.as_view(reason=reason)


RUNS_ARE_REQUESTS = ("a run here lasts one request (or one stream_execute websocket, which "
                     "ends it when closed); there is no kernel runner to interrupt or to "
                     "complete code")

# The routes of the Backend.AI manager, where its client SDK and CLI expect them.
compat_urls = [
    path("session", with_follow_up(compat.CreateSession.as_view())),
    path("session/_/create", with_follow_up(compat.CreateSession.as_view())),
    path("session/_/create-from-template",
         with_follow_up(compat_templates.CreateFromTemplate.as_view())),
    path("session/_/create-cluster", with_follow_up(compat_templates.CreateCluster.as_view())),
    path("session/_/match", compat.MatchSessions.as_view()),
    path("session/_/logs", compat.TaskLogs.as_view()),
    path("session/<str:ref>", with_follow_up(compat.SessionResource.as_view())),
    path("session/<str:ref>/rename", compat.RenameSession.as_view()),
    path("session/<str:ref>/stop", compat.StopSession.as_view()),
    path("session/<str:ref>/resume", compat.ResumeSession.as_view()),
    path("session/<str:ref>/logs", compat.SessionLogs.as_view()),
    path("session/<str:ref>/status-history", compat.StatusHistory.as_view()),
    path("session/<str:ref>/upload", with_follow_up(session_files.SessionUpload.as_view())),
    path("session/<str:ref>/download",
         with_follow_up(session_files.SessionDownload.as_view())),
    path("session/<str:ref>/files", with_follow_up(session_files.SessionFiles.as_view())),
    path("session/<str:ref>/dependency-graph", compat.DependencyGraph.as_view()),
    path("session/<str:ref>/commit", compat.CommitSession.as_view()),
    path("session/<str:ref>/imagify", compat.ConvertToImage.as_view()),
    path("template/session", compat_templates.SessionTemplates.as_view()),
    path("template/session/<str:ref>", compat_templates.SessionTemplateResource.as_view()),
    path("events/session", with_follow_up(compat.SessionEvents.as_view())),
    path("events/background-task", with_follow_up(compat.BackgroundTaskEvents.as_view())),
    path("session/<str:ref>/abusing-report", compat.AbusingReport.as_view()),
    path("session/<str:ref>/interrupt", not_supported(RUNS_ARE_REQUESTS)),
    path("session/<str:ref>/complete", not_supported(RUNS_ARE_REQUESTS)),
    path("session/<str:ref>/start-service", not_supported(
        "apps are not served through a wsproxy here: open /sessions/ID/apps/NAME/ in a "
        "browser signed in to this server")),
    path("stream/session/<str:ref>/apps", compat.SessionApps.as_view()),
    path("resource/presets", compat_resources.ResourcePresets.as_view()),
    path("resource/check-presets", compat_resources.CheckPresets.as_view()),
    path("resource/container-registries", compat_resources.ContainerRegistries.as_view()),
    path("resource/recalculate-usage", compat_resources.RecalculateUsage.as_view()),
    path("resource/usage/month", compat_usage.UsagePerMonth.as_view()),
    path("resource/usage/period", compat_usage.UsagePerPeriod.as_view()),
    path("resource/stats/user/month", compat_usage.UserMonthStats.as_view()),
    path("resource/stats/admin/month", compat_usage.AdminMonthStats.as_view()),
    re_path(r"^resource/watcher(?:/.*)?\Z", not_supported(
        "there is no agent watcher: an agent is a process its operator's service manager "
        "runs (python manage.py run_agent)")),
    path("config/resource-slots", compat_resources.ResourceSlotTypes.as_view()),
    path("config/vfolder-types", compat_resources.FolderTypes.as_view()),
    path("manager/status", compat_manager.ManagerStatus.as_view()),
    path("manager/announcement", compat_manager.Announcement.as_view()),
    path("manager/scheduler/operation", compat_manager.SchedulerOperation.as_view()),
    # Backend.AI's vfolder routes (storage_app.compat); /folders/ is the dashboard's.
    path("folders", folders_compat.Folders.as_view()),
    path("folders/_/id", folders_compat.FolderId.as_view()),
    path("folders/_/hosts", folders_compat.FolderHosts.as_view()),
    re_path(r"^folders/_/all[-_]hosts\Z", folders_compat.FolderAllHosts.as_view()),
    re_path(r"^folders/_/allowed[-_]types\Z", folders_compat.FolderAllowedTypes.as_view()),
    path("folders/_/shared", folders_sharing.Shared.as_view()),
    path("folders/_/change-ownership", folders_sharing.ChangeOwnership.as_view()),
    re_path(r"^folders/_/(?:mounts|umounts|fstab)\Z",
            folders_compat.NotSupported.as_view(reason="host-mounts")),
    path("folders/_/perf-metric", folders_compat.NotSupported.as_view(reason="perf-metric")),
    path("folders/invitations/list", folders_sharing.Invitations.as_view()),
    re_path(r"^folders/invitations/list[-_]sent\Z", folders_sharing.SentInvitations.as_view()),
    path("folders/invitations/accept", folders_sharing.AcceptInvitation.as_view()),
    path("folders/invitations/delete", folders_sharing.DeleteInvitation.as_view()),
    path("folders/<str:name>", folders_compat.FolderResource.as_view()),
    path("folders/<str:name>/files", folders_compat.FolderFilesList.as_view()),
    path("folders/<str:name>/mkdir", folders_compat.FolderMkdir.as_view()),
    path("folders/<str:name>/rename-file", folders_compat.FolderRenameFile.as_view()),
    path("folders/<str:name>/move-file", folders_compat.FolderMoveFile.as_view()),
    path("folders/<str:name>/delete-files", folders_compat.FolderDeleteFiles.as_view()),
    path("folders/<str:name>/request-upload", folders_compat.FolderRequestUpload.as_view()),
    path("folders/<str:name>/request-download",
         folders_compat.FolderRequestDownload.as_view()),
    path("folders/<str:name>/rename", folders_compat.FolderRename.as_view()),
    path("folders/<str:name>/update-options", folders_compat.FolderUpdateOptions.as_view()),
    path("folders/<str:name>/force", folders_compat.FolderForceDelete.as_view()),
    path("folders/<str:name>/clone", folders_compat.NotSupported.as_view(reason="clone")),
    path("folders/<str:name>/invite", folders_sharing.Invite.as_view()),
    path("folders/<str:name>/leave", folders_sharing.Leave.as_view()),
    path("folders/<str:name>/share", folders_sharing.Share.as_view()),
    path("folders/<str:name>/unshare", folders_sharing.Unshare.as_view()),
    # The storage proxy's client side (upload: tus; download: HTTP with ranges), where the
    # URLs of request-upload and request-download point.
    path(f"{folders_proxy.PREFIX}/upload/<str:folder_id>/<path:path>", folders_proxy.upload),
    path(f"{folders_proxy.PREFIX}/download/<str:folder_id>/<path:path>",
         folders_proxy.download),
]

urlpatterns = [
    path("", root, name="root"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("sessions/", include("sessions_app.web.urls")),
    path("folders/", include("storage_app.web.urls")),
    path("usage/", include("accounting_app.web.urls")),
    # The Backend.AI client's GraphQL (both releases post to /admin/gql; clients older than
    # API v6 used /admin/graphql): before the admin site, which owns the rest of /admin/.
    path("admin/gql", GraphQLEndpoint.as_view(), name="graphql"),
    path("admin/graphql", GraphQLEndpoint.as_view()),
    # The admin pages of the models that moved to identity_app, at their old addresses too.
    *(path(f"admin/{old}/", include(admin.site.get_model_admin(model).urls))
      for old, model in (("sessions_app/keypair", KeyPair), ("scheduling_app/domain", Domain),
                         ("scheduling_app/project", Project),
                         ("scheduling_app/resourcepolicy", ResourcePolicy))),
    path("admin/", admin.site.urls),
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("metrics", metrics_view, name="metrics"),
    *compat_urls,
    # [\s\S] and \Z: a path with an encoded newline is under /api/ too.
    re_path(r"^v2(?:/[\s\S]*)?\Z", not_supported(
        "the v2 REST API (backend.ai v2 …) is not served here; the v1 routes and GraphQL "
        "that the SDK's functions and the other CLI commands use are")),
    re_path(r"^(?:api|session|events|template|resource|config|manager)(?P<rest>/[\s\S]*)?\Z",
            not_found),
]
