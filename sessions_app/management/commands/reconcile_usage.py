from django.core.management.base import BaseCommand

from sessions_app.accounting import reconcile_usage


class Command(BaseCommand):
    help = "Recompute agents' occupied slots and keypairs' concurrency from the live kernels."

    def handle(self, *args, **options):
        fixed = reconcile_usage()
        self.stdout.write(f"corrected {len(fixed['agents'])} agents, "
                          f"{len(fixed['keypairs'])} keypairs")
        for kind, ids in fixed.items():
            for pk in ids:
                self.stdout.write(f"  {kind[:-1]} {pk}")
