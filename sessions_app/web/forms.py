"""The dashboard's create form: widgets for SessionSpec's fields (sessions_app/spec.py), which
validates them; the form only shows its limits and what remains of the user's quota."""

import contextlib
import json
from decimal import Decimal

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator

from agents_app.models import Image, resource_limits
from common.devices import SHARES, WHOLE, device_part, is_device_slot, kind_of
from common.slots import ResourceSlots, SlotError, format_bytes
from scheduling_app.models import ScalingGroup
from sessions_app.enums import SessionType
from sessions_app.lifecycle.create import create_from_spec
from sessions_app.models import SessionTemplate
from sessions_app.quota import quota_of
from sessions_app.session_templates import check_template, form_initial
from sessions_app.spec import DomainError, Limits, SessionSpec, offered_slots
from storage_app.folders import visible_folders

MIB = 2**20


def scaling_group_choices():
    names = ScalingGroup.objects.filter(is_active=True).order_by("name").values_list(
        "name", flat=True)
    return [(name, name) for name in names] or [("default", "default")]


def image_choices(user_id=None):
    names = sorted(set(Image.objects.usable_by(user_id).values_list("name", flat=True)))
    names = names or [settings.DEFAULT_KERNEL_IMAGE]
    return [(name, name) for name in names]


# How the create form names each kind of device slot (common/devices.py).
DEVICE_LABELS = {WHOLE: "whole devices", SHARES: "fractions of a device"}


def accelerator_choices():
    """The device slots the agents offer, for the form's accelerator field."""
    slots = sorted(name for name in offered_slots() if is_device_slot(name))
    return [("", "None")] + [
        (name, f"{name} ({DEVICE_LABELS[name[len(kind_of(name)):]]})") for name in slots]


def image_minimums(user_id=None):
    """{image: {"cpu": cores, "mem": MiB, "accelerator": slot, "accelerators": amount}}:
    the least a kernel of each registered image may have (its ai.backend.resource.min.*
    labels), as the form's fields count them."""
    minimums = {}
    for name, labels in Image.objects.usable_by(user_id).values_list("name", "labels"):
        least = resource_limits(labels)[0]
        fields = {}
        if least.get("cpu"):
            fields["cpu"] = float(least["cpu"])
        if least.get("mem"):
            fields["mem"] = -(-int(least["mem"]) // MIB)  # whole MiB, rounded up
        for slot, amount in sorted(device_part(least).items())[:1]:
            fields["accelerator"], fields["accelerators"] = slot, float(amount)
        if fields:
            minimums[name] = fields
    return minimums


class SessionForm(forms.Form):
    template = forms.ChoiceField(
        required=False, label="Template",
        help_text="One of your session templates: its environment variables and bootstrap "
                  "script come with it; the fields below start from its values.")
    name = forms.CharField(
        max_length=64, help_text="Letters, digits, '.', '_' or '-'; unique among your live "
                                 "sessions.")
    image = forms.ChoiceField(choices=image_choices)
    scaling_group = forms.ChoiceField(
        required=False, label="Scaling group", choices=scaling_group_choices,
        initial="default",
        help_text="The agents it runs on (a template may name its own).")
    session_type = forms.ChoiceField(
        label="Type", choices=[(SessionType.INTERACTIVE, "Interactive"),
                               (SessionType.BATCH, "Batch")],
        help_text="A batch session runs its startup command and ends with it.")
    cpu = forms.DecimalField(label="CPU cores", min_value=Decimal("0.1"), max_digits=7,
                             decimal_places=2, initial=1, help_text="Per kernel.")
    mem = forms.IntegerField(label="Memory (MiB)", min_value=64, initial=256,
                             help_text="Per kernel.")
    accelerator = forms.ChoiceField(
        required=False, label="Accelerator", choices=accelerator_choices,
        help_text="Devices the agents offer, per kernel: whole devices, or fractions of one "
                  "(enforced on the device).")
    accelerators = forms.DecimalField(
        required=False, label="Accelerator amount", min_value=Decimal("0.01"), max_digits=6,
        decimal_places=2, help_text="How many whole devices, or how much of a device "
                                    "(0.5: half of one).")
    cluster_size = forms.IntegerField(min_value=1, initial=1,
                                      help_text="How many kernels (containers).")
    startup_command = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                      help_text="Required for a batch session.")
    grace_period = forms.IntegerField(
        required=False, min_value=0,
        help_text=f"Seconds between SIGTERM and SIGKILL when it stops; empty for "
                  f"{settings.DEFAULT_GRACE_PERIOD}.")
    priority = forms.IntegerField(
        required=False, min_value=0,
        help_text="Higher goes first in the queue; empty for your policy's default.")

    mounts = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Folders",
        help_text="Storage folders to mount read-write at /home/work/NAME; they keep their "
                  "files after the session ends.")
    preemptible = forms.BooleanField(
        required=False, help_text="May be ended for a waiting session of higher priority "
                                  "(where the scaling group allows it).")

    template_problem = None

    def __init__(self, *args, keypair, may_raise_priority=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.keypair = keypair
        self.quota = quota_of(keypair)
        policy = keypair.resource_policy
        self.may_raise_priority = may_raise_priority
        self.fields["priority"].max_value = (
            policy.max_priority if self.may_raise_priority else policy.default_priority)
        self.fields["priority"].validators.append(MaxValueValidator(
            self.fields["priority"].max_value))
        self.fields["priority"].widget.attrs["max"] = str(self.fields["priority"].max_value)
        self.fields["priority"].initial = policy.default_priority
        self.fields["image"].initial = settings.DEFAULT_KERNEL_IMAGE
        # The image's minimum: where the cpu and memory fields start, and their lower bound
        # (static/js/session_form.js follows the chosen image).
        # Committed images are their owners' (sessions_app/commits.py).
        self.fields["image"].choices = image_choices(keypair.user_id)
        self.minimums = image_minimums(keypair.user_id)
        self.fields["image"].widget.attrs["data-minimums"] = json.dumps(self.minimums)
        limits = Limits.current()  # SessionSpec's, checked early for the browser too
        self._bound("cluster_size", limits.max_cluster_size, "the most kernels allowed")
        self._bound("grace_period", limits.max_grace_period, "the longest grace period allowed")
        self.templates = {str(t.pk): t for t in
                          SessionTemplate.objects.filter(user=keypair.user).order_by("name")}
        self.fields["template"].choices = [("", "None")] + [
            (pk, t.name or pk) for pk, t in self.templates.items()]
        self.fields["mounts"].choices = [
            (f.name, f.name) for f in visible_folders(keypair.user)]
        remaining = self.quota.remaining
        if remaining is not None:
            self._bound("cpu", remaining.get("cpu"))
            if remaining.get("mem") is not None:
                self._bound("mem", int(remaining["mem"] // MIB))

    def start_at_image_minimum(self):
        """The cpu and memory fields of an unbound form start at least at the chosen
        image's minimum, which is also their lower bound in the browser."""
        image = self.initial.get("image") or self.fields["image"].initial
        least = self.minimums.get(image, {})
        if least.get("accelerator") and not self.initial.get("accelerator"):
            self.initial["accelerator"] = least["accelerator"]
            self.initial["accelerators"] = least["accelerators"]
        for name in ("cpu", "mem"):
            if name in least:
                field = self.fields[name]
                start = self.initial.get(name, field.initial)
                self.initial[name] = max(Decimal(str(start)), Decimal(str(least[name])))
                if name == "mem":
                    self.initial[name] = int(self.initial[name])
                field.widget.attrs["min"] = str(least[name])

    def _bound(self, name, limit, why=None):
        """A maximum that the browser enforces too, and that the error message explains."""
        if limit is None:
            return
        field = self.fields[name]
        why = why or (f"that is what remains of your quota (policy {self.quota.policy_name})")
        field.validators.append(MaxValueValidator(
            limit, message=f"At most %(limit_value)s: {why}."))
        field.widget.attrs["max"] = str(limit)

    def clean(self):
        data = super().clean()
        self.spec = None
        if data.get("accelerator") and not data.get("accelerators"):
            self.add_error("accelerators", f"How much {data['accelerator']} per kernel?")
        try:
            self.spec = SessionSpec.build(keypair=self.keypair,
                                          may_raise_priority=self.may_raise_priority,
                                          **{**self.spec_fields(data),
                                             **self.template_fields(data.get("template"))})
        except DomainError as exc:
            for field, message in exc.errors.items():
                if field not in self.errors:  # the form's own word on a field comes first
                    self.add_error(field if field in self.fields else None, message)
        remaining = self.quota.remaining
        if remaining is not None and not self.errors:
            need = self.requested_slots(data)
            for slot in need.shortfall(remaining):
                kernels = data["cluster_size"]
                self.add_error(slot if slot in self.fields else None, (
                    f"{kernels} kernel{'s' if kernels > 1 else ''} need "
                    f"{self.describe(slot, need[slot])} {slot} in all, more than the "
                    f"{self.describe(slot, remaining.get(slot, 0))} left in your quota."))
        return data

    @staticmethod
    def describe(slot, value):
        if slot == "mem":
            return format_bytes(value)
        return ResourceSlots({slot: value}).to_json()[slot]  # 3, not 3.0

    @staticmethod
    def requested_slots(data):
        per_kernel = ResourceSlots.parse({"cpu": data["cpu"], "mem": data["mem"] * MIB,
                                          **SessionForm.device_request(data)})
        total = ResourceSlots()
        for _ in range(data["cluster_size"]):
            total = total + per_kernel
        return total

    @staticmethod
    def device_request(data):
        """{slot: amount} of the accelerator fields; {} when none is chosen."""
        slot, amount = data.get("accelerator"), data.get("accelerators")
        return {slot: str(amount)} if slot and amount else {}

    @staticmethod
    def spec_fields(data):
        """SessionSpec.build's fields from what the form's fields parsed (None if invalid)."""
        cpu, mem = data.get("cpu"), data.get("mem")
        resources = {"cpu": str(cpu), "mem": f"{mem}m", **SessionForm.device_request(data)}
        return {"name": data.get("name"), "image": data.get("image"),
                "session_type": data.get("session_type"),
                "resources": resources if cpu and mem else None,
                "cluster_size": data.get("cluster_size"),
                "startup_command": data.get("startup_command", ""),
                "grace_period": data.get("grace_period"), "priority": data.get("priority"),
                "scaling_group": data.get("scaling_group") or "default",
                "preemptible": data.get("preemptible", False),
                "mounts": data.get("mounts") or None}

    def template_fields(self, template_id):
        """What a chosen template adds to the form's fields: its environment variables,
        bootstrap script, tag and scaling group."""
        template = self.templates.get(template_id or "")
        if template is None:
            return {}
        checked = check_template(template.template)
        fields = {"environ": checked["environ"], "bootstrap_script": checked["bootstrap"],
                  "tag": checked["metadata"]["tag"]}
        if checked["scaling_group"]:
            fields["scaling_group"] = checked["scaling_group"]
        return fields

    def start_from(self, template_id):
        """Show the template's values as the fields' initial ones (an unbound form)."""
        template = self.templates.get(template_id or "")
        if template is None:
            self.start_at_image_minimum()
            return
        try:
            self.initial.update(form_initial(template.template), template=template_id)
            mem = check_template(template.template)["resources"].get("mem")
        except DomainError as exc:  # stored before a rule it breaks: said when submitted
            self.initial["template"] = template_id
            self.template_problem = exc.message
            return
        if mem:
            with contextlib.suppress(SlotError):  # the submitted form says what is wrong
                self.initial["mem"] = int(ResourceSlots.parse({"mem": mem})["mem"] // MIB)
        self.start_at_image_minimum()

    def save(self, user):
        """Create the session, or add the refusal to the form and return None."""
        try:
            return create_from_spec(self.spec, keypair=self.keypair, user=user)
        except DomainError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
            return None
