"""The dashboard's create form: the API's request, bounded by the user's resource policy."""

from decimal import Decimal

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator

from agents_app.models import Image
from scheduling_app.slots import ResourceSlots, format_bytes
from storage_app.folders import visible_folders

from .quota import quota_of
from .services import MAX_CLUSTER_SIZE, SessionRequestError, create_session

MIB = 2**20


def image_choices():
    names = sorted(set(Image.objects.values_list("name", flat=True)))
    names = names or [settings.DEFAULT_KERNEL_IMAGE]
    return [(name, name) for name in names]


class SessionForm(forms.Form):
    name = forms.CharField(
        max_length=64, help_text="Letters, digits, '.', '_' or '-'; unique among your live "
                                 "sessions.")
    image = forms.ChoiceField(choices=image_choices)
    session_type = forms.ChoiceField(
        label="Type", choices=[("interactive", "Interactive"), ("batch", "Batch")],
        help_text="A batch session runs its startup command and ends with it.")
    cpu = forms.DecimalField(label="CPU cores", min_value=Decimal("0.1"), max_digits=7,
                             decimal_places=2, initial=1, help_text="Per kernel.")
    mem = forms.IntegerField(label="Memory (MiB)", min_value=64, initial=256,
                             help_text="Per kernel.")
    cluster_size = forms.IntegerField(min_value=1, max_value=MAX_CLUSTER_SIZE, initial=1,
                                      help_text="How many kernels (containers).")
    startup_command = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                      help_text="Required for a batch session.")
    grace_period = forms.IntegerField(
        required=False, min_value=0, max_value=3600,
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
        self.fields["mounts"].choices = [
            (f.name, f.name) for f in visible_folders(keypair.user)]
        remaining = self.quota.remaining
        if remaining is not None:
            self._bound("cpu", remaining.get("cpu"))
            if remaining.get("mem") is not None:
                self._bound("mem", int(remaining["mem"] // MIB))

    def _bound(self, name, limit):
        """A maximum that the browser enforces too, and that the error message explains."""
        if limit is None:
            return
        field = self.fields[name]
        field.validators.append(MaxValueValidator(
            limit, message=f"At most %(limit_value)s: that is what remains of your quota "
                           f"(policy {self.quota.policy_name})."))
        field.widget.attrs["max"] = str(limit)

    def clean(self):
        data = super().clean()
        if data.get("session_type") == "batch" and not data.get("startup_command"):
            self.add_error("startup_command", "A batch session needs a startup command.")
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
        per_kernel = ResourceSlots.parse({"cpu": data["cpu"], "mem": data["mem"] * MIB})
        total = ResourceSlots()
        for _ in range(data["cluster_size"]):
            total = total + per_kernel
        return total

    def save(self, user):
        """Create the session, or add the service's refusal to the form and return None."""
        data = self.cleaned_data
        try:
            return create_session(
                keypair=self.keypair, user=user, name=data["name"], image=data["image"],
                session_type=data["session_type"],
                resources={"cpu": str(data["cpu"]), "mem": f"{data['mem']}m"},
                cluster_size=data["cluster_size"], startup_command=data["startup_command"],
                grace_period=data["grace_period"], priority=data.get("priority"),
                may_raise_priority=self.may_raise_priority,
                preemptible=data.get("preemptible", False),
                mounts=data.get("mounts") or None,
            )
        except SessionRequestError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
            return None
