"""Backend.AI's session-template routes (`backend.ai session-template …`) and
create-from-template (`backend.ai session create-from-template`), over
sessions_app.session_templates. A template is seen and changed by its owner (admins: any);
another user's is a 404, as for sessions."""

import yaml
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response

from identity_app.acting import actor_of
from identity_app.api.permissions import owner_keypair, request_is_admin
from sessions_app.api.errors import RequestFailed
from sessions_app.api.views import is_true
from sessions_app.compat.views import (
    CompatView,
    CreateSession,
    body_of,
    first_of,
    project_for,
    text,
)
from sessions_app.models import Session, SessionTemplate
from sessions_app.querysets import as_uuid
from sessions_app.session_templates import as_sdk_request, overlay, parse_payload


def visible_templates(request):
    return SessionTemplate.objects.select_related("user", "project__domain").restrict(
        actor_of(request))


def template_of(request, ref):
    template_id = as_uuid(ref)
    found = visible_templates(request).filter(pk=template_id).first() if template_id else None
    if found is None:
        raise RequestFailed(f"There is no session template {ref!r}.", 404,
                            problem="task-template-not-found")
    return found


def listing(template, request):
    """One row of `session-template list`, in the manager's words."""
    return {"name": template.name, "id": str(template.pk),
            "created_at": template.created_at.isoformat(),
            "is_owner": template.user_id == request.user.pk, "type": "task",
            "user": str(template.user_id), "user_email": template.user.email,
            "group": str(template.project_id), "group_name": template.project.name,
            "domain_name": template.project.domain.name, "template": template.template}


@extend_schema(exclude=True)
class SessionTemplates(CompatView):
    """GET: the caller's templates (admins with `all`: everyone's); POST: store the
    payload's templates for the owner, in the group named (default: the default one)."""

    def get(self, request):
        data = request.data if isinstance(request.data, dict) else {}
        list_all = is_true(request.query_params.get("all", data.get("all", False)))
        templates = visible_templates(request)
        if not (list_all and request_is_admin(request)):
            templates = templates.filter(user=request.user)
        return Response([listing(t, request) for t in templates.order_by("created_at")])

    def post(self, request):
        data = body_of(request)
        owner = owner_keypair(request, data.get("owner_access_key"), creating=True)
        project = project_for(text(data.get("domain_name"), "domain_name"),
                              text(data.get("group_name"), "group_name"))
        if data.get("payload") is None:
            raise RequestFailed("payload (the template, YAML or JSON) is required.",
                                data={"payload": ["required"]})
        created = [SessionTemplate.objects.create(name=name, user=owner.user, project=project,
                                                  template=document)
                   for name, document in parse_payload(data["payload"])]
        return Response([{"id": str(t.pk), "user": str(t.user_id)} for t in created],
                        status=status.HTTP_201_CREATED)


class FormatIsAParameter(DefaultContentNegotiation):
    """`format` is this route's own parameter (the template's), not DRF's renderer
    override, which would answer a 404 for `format=yaml`. Always JSON (errors, PUT and
    DELETE); a YAML body is answered as plain text by the view."""

    def select_renderer(self, request, renderers, format_suffix=None):
        renderer = renderers[0]
        return renderer, renderer.media_type


@extend_schema(exclude=True)
class SessionTemplateResource(CompatView):
    """GET (`format` yaml, the default, or json), PUT (`payload`: one template), DELETE."""

    content_negotiation_class = FormatIsAParameter

    def get(self, request, ref):
        template = template_of(request, ref)
        body_format = request.query_params.get("format", "yaml")
        if body_format == "json":
            return Response(template.template)
        if body_format != "yaml":
            raise RequestFailed("format is yaml or json.", data={"format": ["yaml or json"]})
        return HttpResponse(yaml.safe_dump(template.template, sort_keys=False),
                            content_type="text/yaml; charset=utf-8")

    def put(self, request, ref):
        template = template_of(request, ref)
        data = body_of(request)
        templates = parse_payload(data.get("payload"))
        if len(templates) != 1:
            raise RequestFailed("An update carries one template.",
                                data={"payload": ["one template"]})
        name, document = templates[0]
        SessionTemplate.objects.filter(pk=template.pk).update(name=name, template=document)
        return Response({"success": True})

    def delete(self, request, ref):
        template_of(request, ref).delete()
        return Response({"success": True})


@extend_schema(exclude=True)
class CreateFromTemplate(CreateSession):
    """POST /session/_/create-from-template: the template's create request with the
    request's own values laid over it; answered as POST /session."""

    def post(self, request):
        data = body_of(request)
        template = template_of(request, data.get("template_id") or data.get("templateId"))
        base = as_sdk_request(template.template)
        # The template's group unless the request names one.
        base.update(group=template.project.name, domain=template.project.domain.name)
        request_body = {k: v for k, v in data.items() if k not in ("template_id", "templateId")}
        return self.answer(request, overlay(base, request_body))


@extend_schema(exclude=True)
class CreateCluster(CreateSession):
    """POST /session/_/create-cluster: a session of the stored template `template_id`
    (its kernels: the template's spec.cluster_size and cluster_mode), with the manager's
    create-cluster fields laid over it; answered as POST /session, with `kernelId` (the
    main kernel's id) as the manager gives it."""

    def post(self, request):
        data = body_of(request)
        template_id = first_of(data, "template_id", "templateId")
        if not template_id:
            raise RequestFailed("template_id (a stored session template) is required.",
                                data={"template_id": ["required"]})
        template = template_of(request, template_id)
        base = as_sdk_request(template.template)
        base.update(group=template.project.name, domain=template.project.domain.name)
        response = self.answer(request, overlay(base, {
            "name": first_of(data, "clientSessionToken", "session_name", "name"),
            "type": first_of(data, "type", "sessionType", "session_type"),
            "group": first_of(data, "group", "groupName", "group_name"),
            "domain": first_of(data, "domain", "domainName", "domain_name"),
            "tag": data.get("tag"), "enqueueOnly": data.get("enqueueOnly"),
            "maxWaitSeconds": data.get("maxWaitSeconds"),
            "owner_access_key": data.get("owner_access_key"),
            "config": {"scalingGroup": first_of(data, "scalingGroup", "scaling_group")}}))
        session = Session.objects.get(pk=response.data["sessionId"])
        response.data["kernelId"] = str(session.main_kernel.pk)
        return response
