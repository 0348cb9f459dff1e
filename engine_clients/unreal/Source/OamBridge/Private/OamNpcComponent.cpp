// OamNpcComponent.cpp
#include "OamNpcComponent.h"

#include "Engine/GameInstance.h"
#include "Engine/Level.h"
#include "Engine/World.h"
#include "GameFramework/Actor.h"
#include "Misc/PackageName.h"

#include <string>

#include "OamBridgeSubsystem.h"
#include "OamJson.h"
#include "oam_client.h"

using OamJson::ToFString;
using OamJson::ToStd;

UOamNpcComponent::UOamNpcComponent() = default;
UOamNpcComponent::UOamNpcComponent(FVTableHelper& Helper) : Super(Helper) {}
UOamNpcComponent::~UOamNpcComponent() = default;

UOamBridgeSubsystem* UOamNpcComponent::GetBridge() const
{
	const UWorld* World = GetWorld();
	UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
	return GameInstance ? GameInstance->GetSubsystem<UOamBridgeSubsystem>() : nullptr;
}

FString UOamNpcComponent::GetNpcId() const
{
	if (!Config.NpcId.IsEmpty())
	{
		return Config.NpcId;
	}
	const AActor* Owner = GetOwner();
	if (!Owner)
	{
		return GetName();
	}
	// An actor's name is unique in its level only: two streamed sublevels may each hold a
	// "Guard_1". An actor of a sublevel is "<its map's name>/<its name>" ("Docks/Guard_1"; Play
	// In Editor's UEDPIE_n_ prefix removed, so the id is the same in the editor and the packaged
	// game, and a transcript saved under it loads in both); the persistent level's keep their name.
	const ULevel* Level = Owner->GetLevel();
	const UWorld* World = Owner->GetWorld();
	if (Level && World && World->PersistentLevel && Level != World->PersistentLevel)
	{
		const FString Map = UWorld::RemovePIEPrefix(FPackageName::GetShortName(Level->GetOutermost()->GetName()));
		return Map + TEXT("/") + Owner->GetName();
	}
	return Owner->GetName();
}

void UOamNpcComponent::BeginPlay()
{
	Super::BeginPlay();
	if (bCreateOnBeginPlay)
	{
		CreateNpc();
	}
}

void UOamNpcComponent::EndPlay(const EEndPlayReason::Type EndPlayReason)
{
	UOamBridgeSubsystem* Bridge = GetBridge();
	if (bDeleteOnEndPlay && Bridge && Bridge->GetClient())
	{
		Bridge->GetClient()->request("npc/delete", {{"npcId", ToStd(GetNpcId())}}, [](const oam::Response&) {});
	}
	Super::EndPlay(EndPlayReason);
}

bool UOamNpcComponent::CreateNpc()
{
	UOamBridgeSubsystem* Bridge = GetBridge();
	FString Error;
	oam::json Params = OamJson::CreateParams(Config, GetNpcId(), Error);
	if (!Bridge || !Bridge->GetClient() || Params.is_discarded())
	{
		const FOamError E = Params.is_discarded() ? OamJson::MakeError(TEXT("invalid_params"), Error)
												  : OamJson::MakeError(TEXT("no_bridge"), TEXT("the bridge is not running (see LogOamBridge)"));
		UE_LOG(LogOamBridge, Warning, TEXT("CreateNpc(%s): %s"), *GetNpcId(), *E.Message);
		OnCreated.Broadcast(false, E);
		return false;
	}
	TWeakObjectPtr<UOamNpcComponent> WeakThis(this);
	Bridge->GetClient()->request("npc/create", std::move(Params), [WeakThis](const oam::Response& R)
		{
			if (UOamNpcComponent* Self = WeakThis.Get())
			{
				if (!R.ok())
				{
					UE_LOG(LogOamBridge, Warning, TEXT("npc/create %s: %s"), *Self->GetNpcId(), UTF8_TO_TCHAR(R.error->what()));
				}
				Self->OnCreated.Broadcast(R.ok(), R.ok() ? FOamError() : OamJson::ToError(*R.error));
			}
		});
	return true;
}

bool UOamNpcComponent::Fail(const FTurnHandlers& Handlers, const FString& Code, const FString& Message)
{
	const FOamError E = OamJson::MakeError(Code, Message);
	UE_LOG(LogOamBridge, Warning, TEXT("%s: %s"), *GetNpcId(), *Message);
	OnTurnFailed.Broadcast(FString(), E);
	if (Handlers.OnDone)
	{
		Handlers.OnDone(false, FOamTurnResult(), FOamDecision(), E);
	}
	return false;
}

// The core's callbacks for one turn of this component: its events go to this component's
// delegates and the turn's handlers. They run on the game thread (the subsystem's dispatcher)
// and do nothing once the component is gone.
static oam::Turn::Callbacks ComponentCallbacks(UOamNpcComponent* Component, UOamNpcComponent::FTurnHandlers Handlers)
{
	TWeakObjectPtr<UOamNpcComponent> Weak(Component);
	auto Shared = std::make_shared<UOamNpcComponent::FTurnHandlers>(MoveTemp(Handlers));
	auto Text = std::make_shared<FString>();  // the text so far, for the partial results
	oam::Turn::Callbacks Callbacks;
	Callbacks.onEvent = [Weak, Shared, Text](const oam::Event& E)
	{
		UOamNpcComponent* Self = Weak.Get();
		if (!Self)
		{
			return;
		}
		if (E.method == "turn/textDelta")
		{
			FOamTurnResult Partial;
			Partial.NpcId = ToFString(E.npcId());
			Partial.TurnId = ToFString(E.turnId());
			Partial.Delta = ToFString(OamJson::Str(E.params, "delta"));
			Partial.bIsReset = oam::boolField(E.params, "isReset");
			*Text = Partial.bIsReset ? Partial.Delta : *Text + Partial.Delta;
			Partial.Text = *Text;
			Self->OnTextDelta.Broadcast(Partial.TurnId, Partial.Delta, Partial.bIsReset);
			if (Shared->OnDelta)
			{
				Shared->OnDelta(Partial);
			}
		}
		else if (E.method == "turn/toolCallRequested")
		{
			FOamToolCall Call;
			Call.NpcId = ToFString(E.npcId());
			Call.TurnId = ToFString(E.turnId());
			Call.CallId = ToFString(OamJson::Str(E.params, "callId"));
			Call.ToolName = ToFString(OamJson::Str(E.params, "name"));
			Call.ArgumentsJson = OamJson::Dump(E.params.contains("arguments") ? E.params["arguments"] : oam::json::object());
			Self->OnToolCall.Broadcast(Call);
		}
	};
	Callbacks.onFinished = [Weak, Shared](const oam::Turn& Turn)
	{
		UOamNpcComponent* Self = Weak.Get();
		if (!Self)
		{
			return;
		}
		try
		{
			const oam::json Completed = Turn.completion().get();
			const FOamTurnResult Result = OamJson::TurnResult(Turn.npcId(), Turn.turnId(), Completed);
			FOamDecision Decision;
			if (Turn.kind() == "decide")
			{
				Decision = OamJson::Decision(Turn.turnId(), Completed);
				Self->OnDecision.Broadcast(Decision);
			}
			Self->OnTurnCompleted.Broadcast(Result);
			if (Shared->OnDone)
			{
				Shared->OnDone(true, Result, Decision, FOamError());
			}
		}
		catch (const oam::BridgeError& B)
		{
			const FOamError Error = OamJson::ToError(B);
			const FString TurnId = ToFString(Turn.turnId());
			Self->OnTurnFailed.Broadcast(TurnId, Error);
			if (Shared->OnDone)
			{
				FOamTurnResult Result;
				Result.NpcId = ToFString(Turn.npcId());
				Result.TurnId = TurnId;
				Shared->OnDone(false, Result, FOamDecision(), Error);
			}
		}
	};
	return Callbacks;
}

bool UOamNpcComponent::StartRespond(const FString& Prompt, const FString& Speaker, FTurnHandlers Handlers)
{
	UOamBridgeSubsystem* Bridge = GetBridge();
	if (!Bridge || !Bridge->GetClient())
	{
		return Fail(Handlers, TEXT("no_bridge"), TEXT("Respond: the bridge is not running (see LogOamBridge)"));
	}
	oam::json Options = oam::json::object();
	if (!Speaker.IsEmpty())
	{
		Options["speaker"] = ToStd(Speaker);
	}
	const FString Guardrail = Config.Guardrail.IsEmpty() ? Bridge->DefaultGuardrail : Config.Guardrail;
	if (!Guardrail.IsEmpty())
	{
		Options["guardrail"] = ToStd(Guardrail);
	}
	Bridge->GetClient()->respond(ToStd(GetNpcId()), ToStd(Prompt), std::move(Options), ComponentCallbacks(this, MoveTemp(Handlers)));
	return true;
}

bool UOamNpcComponent::StartDecide(const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning,
	bool bRemember, FTurnHandlers Handlers)
{
	UOamBridgeSubsystem* Bridge = GetBridge();
	if (!Bridge || !Bridge->GetClient())
	{
		return Fail(Handlers, TEXT("no_bridge"), TEXT("Decide: the bridge is not running (see LogOamBridge)"));
	}
	if (Options.Num() == 0)
	{
		return Fail(Handlers, TEXT("invalid_params"), TEXT("Decide: no options"));
	}
	Bridge->GetClient()->decide(ToStd(GetNpcId()), ToStd(Situation), OamJson::DecisionOptionsJson(Options),
		{{"reasoning", bReasoning}, {"remember", bRemember}}, ComponentCallbacks(this, MoveTemp(Handlers)));
	return true;
}

bool UOamNpcComponent::Respond(const FString& Prompt, const FString& Speaker)
{
	return StartRespond(Prompt, Speaker, FTurnHandlers());
}

bool UOamNpcComponent::Decide(const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning, bool bRemember)
{
	return StartDecide(Situation, Options, bReasoning, bRemember, FTurnHandlers());
}

bool UOamNpcComponent::Prewarm(const FString& Speaker, const FString& PromptPrefix)
{
	UOamBridgeSubsystem* Bridge = GetBridge();
	if (!Bridge || !Bridge->GetClient())
	{
		return Fail(FTurnHandlers(), TEXT("no_bridge"), TEXT("Prewarm: the bridge is not running"));
	}
	Bridge->GetClient()->prewarm(ToStd(GetNpcId()), ToStd(Speaker), ToStd(PromptPrefix),
		ComponentCallbacks(this, FTurnHandlers()));
	return true;
}

// A request about this NPC whose failure is only logged.
static bool SendLogged(UOamNpcComponent* Self, const char* Method, oam::json Params)
{
	UOamBridgeSubsystem* Bridge = Self->GetBridge();
	if (!Bridge || !Bridge->GetClient())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s %s: the bridge is not running"), UTF8_TO_TCHAR(Method), *Self->GetNpcId());
		return false;
	}
	Params["npcId"] = ToStd(Self->GetNpcId());
	Bridge->GetClient()->request(Method, std::move(Params), [Method](const oam::Response& R)
		{
			if (!R.ok())
			{
				UE_LOG(LogOamBridge, Warning, TEXT("%s failed: %s"), UTF8_TO_TCHAR(Method), UTF8_TO_TCHAR(R.error->what()));
			}
		});
	return true;
}

bool UOamNpcComponent::Cancel()
{
	return SendLogged(this, "npc/cancel", oam::json::object());
}

bool UOamNpcComponent::SetTags(const TArray<FString>& Tags)
{
	Config.Tags = Tags;
	return SendLogged(this, "npc/setTags", {{"tags", OamJson::ToStdList(Tags)}});
}

bool UOamNpcComponent::SubmitToolOutput(const FString& CallId, const FString& OutputJson)
{
	oam::json Output = OamJson::Parse(OutputJson, nullptr);
	if (Output.is_discarded())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SubmitToolOutput(%s): OutputJson is not JSON"), *CallId);
		return false;
	}
	return SendLogged(this, "npc/submit", {{"callId", ToStd(CallId)}, {"output", std::move(Output)}});
}

bool UOamNpcComponent::SubmitToolError(const FString& CallId, const FString& Error)
{
	return SendLogged(this, "npc/submit", {{"callId", ToStd(CallId)}, {"error", ToStd(Error)}});
}
